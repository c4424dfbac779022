// Package cuda is qpack's GPU runtime: the NVIDIA driver API opened at run time through purego
// (no cgo, so one static binary runs with or without a GPU), a Device whose driver calls are
// serialized and run with its context made current on the calling OS thread, device and
// pinned host memory, copies, streams, events, modules loaded from embedded PTX, kernel launches,
// and a loader that finds cuBLAS and cuSOLVER. Kernels live with their algorithm; this package
// only runs them, except the dtype conversions every GPU path needs (kernels/convert.cu).
package cuda
