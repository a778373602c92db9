// The plan bundle fuzzer's second seed (fuzz/CMakeLists.txt): a save of KV
// and hidden states and a transfer, compiled by kvc-save-pipeline with
// their save kernels for Llama-3.1-8B on an H100: gathers, quants, stores,
// sends and recvs, and the save kernels' table entries.
kvc.save @doc tokens 0 to 512 kv hidden to "ssd" {max_error = 0.05, layer_group = 4 : i64}

kvc.transfer @move tokens 0 to 300 from "prefill-0" to "decode-0"
    {max_error = 0.05, layer_group = 4 : i64}
