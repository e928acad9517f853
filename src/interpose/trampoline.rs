//! Trampolines: a wrapper for a driver function vgpu does not know the
//! signature of. Each one runs [`Gate`] first (with its arguments kept
//! aside), then jumps to the real function with the registers and stack
//! exactly as the caller left them, so the real function returns straight
//! to the caller.
//!
//! Oversubscription needs it. The checkpoint API's lock blocks *every*
//! driver call of a suspended process, and the process is restored by its
//! own next call. A PyTorch job whose first call after an idle spell was
//! one vgpu does not hook blocked in the driver for ever, with nobody to
//! restore it (run 21). With `CUDA_OVERSUBSCRIBE`, `cuGetProcAddress`
//! (cudart's path to every entry point) hands out a trampoline for every
//! function that has no hook, and the gate restores the process first.
//!
//! x86-64 only (System V calling convention); elsewhere [`wrap`] declines
//! and the real pointer is handed out, as before.

use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// Trampolines in the table; every distinct real function takes one.
/// Driver 580 has about 600 entry points.
pub const SLOTS: usize = 1024;

/// What runs before the real function: Ok, or the answer the call gets
/// instead (it is never made).
pub type Gate = fn() -> Result<(), i32>;

static GATE: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());
static REAL: [AtomicPtr<c_void>; SLOTS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS];
static USED: AtomicUsize = AtomicUsize::new(0);

/// Sets the gate (once, before the first [`wrap`]).
pub fn set_gate(gate: Gate) {
    GATE.store(gate as *mut (), Ordering::Release);
}

/// A trampoline for `real`, the same one for the same function; None when
/// the table is full or this architecture has none.
pub fn wrap(real: *mut c_void) -> Option<*mut c_void> {
    if real.is_null() || GATE.load(Ordering::Acquire).is_null() || !cfg!(target_arch = "x86_64") {
        return None;
    }
    loop {
        let used = USED.load(Ordering::Acquire);
        if let Some(i) = (0..used.min(SLOTS)).find(|&i| REAL[i].load(Ordering::Acquire) == real) {
            return Some(address(i));
        }
        if used >= SLOTS {
            crate::warn_once!(
                "all {SLOTS} trampolines are taken: further driver functions are handed out unwrapped, and a suspended process may block in them"
            );
            return None;
        }
        // Claim the next slot; a racing wrap of the same function may
        // take another (both work; the table is only a little fuller).
        if USED
            .compare_exchange(used, used + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            REAL[used].store(real, Ordering::Release);
            return Some(address(used));
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn address(i: usize) -> *mut c_void {
    unsafe extern "C" {
        static vgpu_trampolines: [u8; 0];
    }
    // Only the table's address (the assembly below defines it).
    let base = (&raw const vgpu_trampolines).cast::<u8>();
    base.wrapping_add(i * 16).cast::<c_void>().cast_mut()
}

#[cfg(not(target_arch = "x86_64"))]
fn address(_: usize) -> *mut c_void {
    std::ptr::null_mut()
}

/// The function a trampoline goes on to: the real one, or one that
/// answers the gate's error without making the call.
extern "C" fn gate(index: u32) -> *const c_void {
    let answer = std::panic::catch_unwind(|| {
        let g = GATE.load(Ordering::Acquire);
        if g.is_null() {
            return Ok(());
        }
        // SAFETY: GATE only ever holds a `Gate` (set_gate).
        let g: Gate = unsafe { std::mem::transmute::<*mut (), Gate>(g) };
        g()
    })
    .unwrap_or(Ok(()));
    match answer {
        Ok(()) => REAL[index as usize % SLOTS].load(Ordering::Acquire),
        Err(rc) => {
            LAST_ANSWER.with(|a| a.set(rc));
            answer_instead as *const c_void
        }
    }
}

thread_local! {
    static LAST_ANSWER: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

/// Called in the real function's place (its arguments are ignored: the
/// caller cleans up the stack in this convention).
extern "C" fn answer_instead() -> i32 {
    LAST_ANSWER.with(std::cell::Cell::get)
}

// Each of the SLOTS entries is 16 bytes: its index into %r11d, then a jump
// to the common part, which saves the six integer argument registers,
// %rax (%al counts a variadic call's vector arguments) and xmm0-7 (the
// stack arguments are untouched), calls `gate(index)` with the stack
// 16-byte aligned, restores them all and jumps to what the gate returned.
// (On entry %rsp is 8 mod 16; after %rbp and six pushes it is 0, %rax
// makes it 8, and 136 bytes for xmm0-7 and padding make it 0 again.)
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    r#"
    .pushsection .text.vgpu_trampolines,"ax",@progbits
    .balign 16
    .globl vgpu_trampolines
    .hidden vgpu_trampolines
vgpu_trampolines:
    .set vgpu_tramp_i, 0
    .rept {slots}
    .balign 16
    movl $vgpu_tramp_i, %r11d
    jmp vgpu_trampoline_common
    .set vgpu_tramp_i, vgpu_tramp_i + 1
    .endr
    .balign 16
vgpu_trampoline_common:
    push %rbp
    mov %rsp, %rbp
    push %rdi
    push %rsi
    push %rdx
    push %rcx
    push %r8
    push %r9
    push %rax
    sub $136, %rsp
    movdqu %xmm0, 0(%rsp)
    movdqu %xmm1, 16(%rsp)
    movdqu %xmm2, 32(%rsp)
    movdqu %xmm3, 48(%rsp)
    movdqu %xmm4, 64(%rsp)
    movdqu %xmm5, 80(%rsp)
    movdqu %xmm6, 96(%rsp)
    movdqu %xmm7, 112(%rsp)
    mov %r11d, %edi
    call {gate}
    mov %rax, %r11
    movdqu 0(%rsp), %xmm0
    movdqu 16(%rsp), %xmm1
    movdqu 32(%rsp), %xmm2
    movdqu 48(%rsp), %xmm3
    movdqu 64(%rsp), %xmm4
    movdqu 80(%rsp), %xmm5
    movdqu 96(%rsp), %xmm6
    movdqu 112(%rsp), %xmm7
    add $136, %rsp
    pop %rax
    pop %r9
    pop %r8
    pop %rcx
    pop %rdx
    pop %rsi
    pop %rdi
    pop %rbp
    jmp *%r11
    .popsection
"#,
    slots = const SLOTS,
    gate = sym gate,
    options(att_syntax)
);

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    static GATED: AtomicU32 = AtomicU32::new(0);
    static REFUSE: AtomicU32 = AtomicU32::new(0);

    fn count() -> Result<(), i32> {
        GATED.fetch_add(1, Ordering::SeqCst);
        match REFUSE.load(Ordering::SeqCst) {
            0 => Ok(()),
            rc => Err(rc as i32),
        }
    }

    /// Eight integer arguments (two on the stack) and two doubles: every
    /// one must arrive.
    extern "C" fn many(
        a: u64,
        b: u64,
        c: u64,
        d: u64,
        e: u64,
        f: u64,
        g: u64,
        h: u64,
        x: f64,
        y: f64,
    ) -> i32 {
        let ints = [a, b, c, d, e, f, g, h];
        let want: Vec<u64> = (1..=8).map(|k| k * 0x1_0000_0001).collect();
        (ints.as_slice() == want.as_slice() && x == 0.5 && y == -2.25) as i32 + 40
    }

    extern "C" fn other() -> i32 {
        7
    }

    unsafe extern "C" {
        fn vgpu_test_return_al();
    }
    std::arch::global_asm!(
        ".pushsection .text.vgpu_test_return_al,\"ax\",@progbits",
        ".balign 16",
        "vgpu_test_return_al:",
        "movzbl %al, %eax",
        "ret",
        ".popsection",
        options(att_syntax)
    );

    #[test]
    fn a_trampoline_runs_the_gate_then_the_real_function_with_every_argument() {
        set_gate(count);
        let p = wrap(many as *mut c_void).unwrap();
        assert_eq!(
            wrap(many as *mut c_void),
            Some(p),
            "one trampoline per function"
        );
        let q = wrap(other as *mut c_void).unwrap();
        assert_ne!(p, q);
        type Many = extern "C" fn(u64, u64, u64, u64, u64, u64, u64, u64, f64, f64) -> i32;
        // SAFETY: the trampoline jumps to `many`, whose signature this is.
        let t: Many = unsafe { std::mem::transmute::<*mut c_void, Many>(p) };
        let k = |n: u64| n * 0x1_0000_0001;
        let before = GATED.load(Ordering::SeqCst);
        assert_eq!(
            t(k(1), k(2), k(3), k(4), k(5), k(6), k(7), k(8), 0.5, -2.25),
            41
        );
        assert_eq!(GATED.load(Ordering::SeqCst), before + 1);
        // SAFETY: as above, for `other`.
        let o: extern "C" fn() -> i32 =
            unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> i32>(q) };
        assert_eq!(o(), 7);
        // A gate that refuses: the real function is not called, its answer is returned.
        REFUSE.store(401, Ordering::SeqCst);
        assert_eq!(t(0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0), 401);
        REFUSE.store(0, Ordering::SeqCst);
        assert_eq!(o(), 7);

        // A variadic function gets its floating-point arguments: %al tells
        // it how many vector registers hold arguments, and the trampoline
        // must pass it through.
        type Snprintf =
            unsafe extern "C" fn(*mut std::ffi::c_char, usize, *const std::ffi::c_char, ...) -> i32;
        let p = wrap(libc::snprintf as *mut c_void).unwrap();
        // SAFETY: the trampoline jumps to snprintf, whose signature this is.
        let f: Snprintf = unsafe { std::mem::transmute::<*mut c_void, Snprintf>(p) };
        let mut buf = [0 as std::ffi::c_char; 32];
        // SAFETY: a 32-byte buffer, a NUL-terminated format and the two
        // doubles it names.
        let n = unsafe {
            f(
                buf.as_mut_ptr(),
                buf.len(),
                c"%.2f %.1f".as_ptr(),
                2.5f64,
                -0.75f64,
            )
        };
        // SAFETY: snprintf NUL-terminated the buffer.
        let out = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        assert_eq!((n, out.to_str().unwrap()), (9, "2.50 -0.8"));
        // And exactly: a callee that returns the %al it got.
        type Al = unsafe extern "C" fn(i32, ...) -> i32;
        let p = wrap(vgpu_test_return_al as *mut c_void).unwrap();
        // SAFETY: the trampoline jumps to vgpu_test_return_al, which
        // reads no argument.
        let al: Al = unsafe { std::mem::transmute::<*mut c_void, Al>(p) };
        // SAFETY: as above.
        assert_eq!(unsafe { al(0, 1.0f64, 2.0f64, 3.0f64) }, 3);
    }
}
