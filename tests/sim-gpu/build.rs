//! The real driver's own calls between its entry points (a `_ptsz` variant
//! to its legacy twin, say) never go through an interposer: bind ours
//! inside the library too, or vgpu would count such a call twice.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
