//! `libvgpu.so`, the preloaded stub, is built by this package's build
//! script from `stub.c` (see there for why it is C); this crate itself is
//! empty.
