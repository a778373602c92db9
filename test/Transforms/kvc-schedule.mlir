// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-expand --kvc-fuse --kvc-schedule | FileCheck %s --check-prefix=ROOMY
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-expand --kvc-fuse --kvc-schedule=staging-mib=20 | FileCheck %s --check-prefix=ROUNDS
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-expand --kvc-fuse --kvc-schedule=staging-mib=1000000 | FileCheck %s --check-prefix=NOFETCH

#kv = #kvc.source<tier = "ssd", form = kv, codec = <quant = int8, lossless = zstd>,
                  tokens = 0 to 1024, layers = 0 to 4>

// Tests that every step becomes a task on its resource, waiting for the
// tasks whose values it uses: fetches on the SSD lanes in turn, decoding on
// the decode pool, the copy on the copy engine, the fused kernel on compute.
// ROOMY-LABEL: kvc.plan @p
// ROOMY:         %[[F0:.+]], %{{.+}} = kvc.task on io[0] slot 0 {
// ROOMY:           kvc.fetch
// ROOMY:         %[[D0:.+]], %{{.+}} = kvc.task on decode[0] after %[[F0]] {
// ROOMY:           kvc.decompress
// ROOMY:         %[[C0:.+]], %{{.+}} = kvc.task on h2d[0] after %[[D0]] {
// ROOMY:           kvc.transfer_to_device
// ROOMY:         %{{.+}} = kvc.task on compute[0] after %[[C0]] {
// ROOMY-NEXT:      kvc.kernel "dequant_scatter"

// Tests that the second fetch takes the next lane and the next slot, and
// does not wait while staging memory lasts.
// ROOMY:         %{{.+}}, %{{.+}} = kvc.task on io[1] slot 1 {

// Tests that when the budget holds one chunk, the request runs in rounds:
// the second fetch reuses slot 0 once the first chunk's copy has freed its
// host buffer, and the second copy waits for the kernel that consumed the
// first chunk from the slot's device buffer.
// ROUNDS-LABEL: kvc.plan @p
// ROUNDS:         kvc.task on io[0] slot 0 {
// ROUNDS:         %[[COPY:.+]], %{{.+}} = kvc.task on h2d[0]
// ROUNDS:         %[[SCATTER:.+]] = kvc.task on compute[0] after %[[COPY]] {
// ROUNDS:         kvc.task on io[1] after %[[COPY]] slot 0 {
// ROUNDS:         %[[DECODE:.+]], %{{.+}} = kvc.task on decode[0]
// ROUNDS:         kvc.task on h2d[0] after %[[DECODE]], %[[SCATTER]] {
kvc.plan @p tokens 0 to 1024 layers 0 to 4 {
  kvc.segment load_kv tokens 0 to 1024 layers 0 to 4 from #kv
}

// Tests that a plan without fetches gets no staging slots however large the
// budget (sized by the budget alone, it was once given one slot per byte).
// NOFETCH-LABEL: kvc.plan @compute
// NOFETCH:         kvc.task on compute[0] {
// NOFETCH-NEXT:      kvc.chunk_compute
// NOFETCH-NOT:     slot
kvc.plan @compute tokens 0 to 1024 layers 0 to 4 {
  kvc.segment compute tokens 0 to 1024 layers 0 to 4
}
