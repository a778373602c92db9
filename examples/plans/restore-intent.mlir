// A chat request whose 4K-token history is stored twice: hidden states on
// the local disk and int8+deflate KV in host DRAM. The planner (kvc-plan)
// turns this intent into a kvc.plan, and fails if no plan restores it
// within slo_ms on the target (Llama-2-7B on targets/cpu-2core.json takes
// about 4.3 s).
kvc.restore @chat tokens 0 to 4096 from [
    #kvc.source<tier = "disk", form = hidden, tokens = 0 to 4096, layers = 0 to 32>,
    #kvc.source<tier = "dram", form = kv, codec = <quant = int8, lossless = deflate>,
                tokens = 0 to 4096, layers = 0 to 32>]
    {slo_ms = 5000.0, max_error = 0.01}

// After the prefill of a shared document, save KV and hidden states.
kvc.save @doc tokens 0 to 4096 kv hidden to "disk" codec <quant = int8, lossless = zstd>
