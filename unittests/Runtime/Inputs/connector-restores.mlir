// The plan of host::Connector's runtime test (unittests/Runtime/
// ConnectorBundleTest.cpp): 256 tokens of exec-model loaded as raw KV from
// tier "dram", compiled ahead (kvc-restore-pipeline strategy=kv,
// chunk-tokens=128), as a server without the compiler passes it
// (host::bundleHook).
kvc.restore @kv tokens 0 to 256 from [
    #kvc.source<tier = "dram", form = kv, tokens = 0 to 256, layers = 0 to 4>]
