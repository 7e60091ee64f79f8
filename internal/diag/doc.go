// Package diag owns the "explain yourself" reports behind `ncclnet-go
// devices`: what the plugin would expose on this host and why.
//
// Diagnose runs the same discovery the plugin runs at init (each registered
// transport's Init, in the glue's order, with NCCL_GO_TRANSPORT honoured the
// same way), so the answer comes from the code NCCL would load, not from a
// second implementation. Transports that know more than nccl.Properties says
// (link layer, GID, the interface list, why a port was skipped) implement
// Explainer and fill their part of the report from their own discovery state.
// PredictVNICs then replays NCCL's NIC fusion (NCCL_NET_MERGE_LEVEL,
// NCCL_NET_FORCE_MERGE) against the live transport's makeVDevice.
package diag
