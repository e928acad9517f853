//! Reading and writing caller memory at the C edge. NULL is allowed
//! wherever the driver allows it, and never dereferenced.
//!
//! A hook receives raw pointers from the program. The FFI edge (the hook
//! tables, `hooks!`) turns each pointer the handler reads or writes into an
//! [`In`] or [`Out`] ([`Arg`], the one `unsafe` step, justified by the
//! driver API's contract), so the handlers behind it hold no `unsafe` code
//! and cannot dereference anything else. vgpu's own calls build them from
//! references (`Out::from(&mut x)`).

use std::ffi::{c_int, c_uint, c_void};
use std::marker::PhantomData;

/// Writes `v` through out-parameter `p`; false when `p` is NULL.
///
/// # Safety
/// `p` is NULL or valid for a (possibly unaligned) write of one `T`.
pub unsafe fn put<T>(p: *mut T, v: T) -> bool {
    if p.is_null() {
        return false;
    }
    // SAFETY: non-NULL, so writable for T (this function's contract).
    unsafe { p.write_unaligned(v) };
    true
}

/// Reads in-parameter `p`; None when NULL.
///
/// # Safety
/// `p` is NULL or valid for a (possibly unaligned) read of one `T`, whose
/// bytes are a valid `T`.
pub unsafe fn get<T: Copy>(p: *const T) -> Option<T> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL, so readable as a T (this function's contract).
    Some(unsafe { p.read_unaligned() })
}

/// Runs `f` when the process exits normally (`exit`, or a return from
/// `main`); false when it cannot be registered.
pub fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: `f` is a plain function that takes nothing and never unwinds
    // (its callers wrap their bodies in catch_unwind).
    unsafe { libc::atexit(f) == 0 }
}

/// An out-parameter: NULL, or one `T` that may be read and written for
/// `'a`. The same bits as `*mut T`, so real functions take it as declared.
#[repr(transparent)]
pub struct Out<'a, T>(*mut T, PhantomData<&'a mut T>);

impl<T> Clone for Out<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Out<'_, T> {}

impl<'a, T> Out<'a, T> {
    /// # Safety
    /// `p` is NULL, or valid for reads and writes of one `T` (unaligned
    /// allowed) for `'a`, and its bytes are a valid `T` whenever read: `T`
    /// is plain data (every bit pattern valid), as the driver's are.
    pub unsafe fn from_raw(p: *mut T) -> Self {
        Self(p, PhantomData)
    }

    pub fn is_null(self) -> bool {
        self.0.is_null()
    }

    /// Writes `v`; false when NULL.
    pub fn put(self, v: T) -> bool {
        // SAFETY: NULL or writable for T for 'a (`from_raw`'s contract,
        // or a `&mut T`).
        unsafe { put(self.0, v) }
    }

    /// What it holds (what the driver wrote, after a call that succeeded);
    /// None when NULL.
    pub fn get(self) -> Option<T>
    where
        T: Copy,
    {
        // SAFETY: NULL or readable as a T for 'a (`from_raw`'s contract,
        // or a `&mut T`).
        unsafe { get(self.0) }
    }
}

impl<'a, T> From<&'a mut T> for Out<'a, T> {
    fn from(r: &'a mut T) -> Self {
        Self(r, PhantomData)
    }
}

/// An in-parameter: NULL, or one readable `T` for `'a`. The same bits as
/// `*const T`.
#[repr(transparent)]
pub struct In<'a, T>(*const T, PhantomData<&'a T>);

impl<T> Clone for In<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for In<'_, T> {}

impl<'a, T> In<'a, T> {
    /// # Safety
    /// `p` is NULL, or valid for reads of one `T` (unaligned allowed) for
    /// `'a`, whose bytes are a valid `T`.
    pub unsafe fn from_raw(p: *const T) -> Self {
        Self(p, PhantomData)
    }

    pub fn is_null(self) -> bool {
        self.0.is_null()
    }

    /// What it points to; None when NULL.
    pub fn get(self) -> Option<T>
    where
        T: Copy,
    {
        // SAFETY: NULL or readable as a T for 'a (`from_raw`'s contract,
        // or a `&T`).
        unsafe { get(self.0) }
    }
}

impl<'a, T> From<&'a T> for In<'a, T> {
    fn from(r: &'a T) -> Self {
        Self(r, PhantomData)
    }
}

/// How a hook's raw C argument becomes its handler's (and its real
/// function's) parameter: unchanged, or a pointer as [`In`]/[`Out`]. The
/// target is the parameter's type, so a handler states what it reads.
pub trait Arg<Raw>: Sized {
    /// # Safety
    /// `raw` is an argument the program passed to a driver function, and
    /// that function's API makes a pointer argument NULL or valid for one
    /// `T` for the whole call (read for an in-parameter, written for an
    /// out-parameter, whose bytes, the program's memory, read as a `T` of
    /// plain data): the contract the program accepted by calling it.
    unsafe fn arg(raw: Raw) -> Self;
}

impl<T> Arg<T> for T {
    #[inline(always)]
    unsafe fn arg(raw: T) -> T {
        raw
    }
}

impl<T> Arg<*mut T> for Out<'_, T> {
    #[inline(always)]
    unsafe fn arg(raw: *mut T) -> Self {
        // SAFETY: the caller's contract (`Arg::arg`) is `from_raw`'s.
        unsafe { Out::from_raw(raw) }
    }
}

impl<T> Arg<*const T> for In<'_, T> {
    #[inline(always)]
    unsafe fn arg(raw: *const T) -> Self {
        // SAFETY: the caller's contract (`Arg::arg`) is `from_raw`'s.
        unsafe { In::from_raw(raw) }
    }
}

/// `cuPointerGetAttribute`'s `data`: an out-parameter whose type its
/// `attribute` argument names (cuda.h), so it is written only through
/// [`AttributeOut::put`], for the attributes whose size it knows.
#[repr(transparent)]
pub struct AttributeOut<'a>(*mut c_void, PhantomData<&'a mut ()>);

impl AttributeOut<'_> {
    /// Attributes whose value is 8 bytes: `CONTEXT` (a `CUcontext`),
    /// `DEVICE_POINTER` and `RANGE_START_ADDR` (`CUdeviceptr`s), `HOST_POINTER`
    /// (a pointer), `RANGE_SIZE` (a `size_t`).
    const EIGHT_BYTES: [c_int; 5] = [1, 3, 4, 11, 12];
    /// Attributes whose value is an `int`: `IS_LEGACY_CUDA_IPC_CAPABLE`.
    const INT: [c_int; 1] = [10];

    /// Writes `v` as `attribute`'s value, in that value's size; false
    /// where the size is not known here, `v` does not fit it, or `data` is
    /// NULL.
    pub fn put(self, attribute: c_int, v: u64) -> bool {
        if Self::EIGHT_BYTES.contains(&attribute) {
            // SAFETY: NULL or valid for the value `attribute` names (the
            // driver API's contract, `Arg`), which is 8 bytes for these.
            return unsafe { put(self.0.cast::<u64>(), v) };
        }
        match c_int::try_from(v) {
            // SAFETY: as above; an `int` for these.
            Ok(v) if Self::INT.contains(&attribute) => unsafe { put(self.0.cast::<c_int>(), v) },
            _ => false,
        }
    }
}

impl Arg<*mut c_void> for AttributeOut<'_> {
    #[inline(always)]
    unsafe fn arg(raw: *mut c_void) -> Self {
        Self(raw, PhantomData)
    }
}

/// `cuPointerGetAttributes`' count: how many entries its two arrays hold.
/// Made only from the call's own argument ([`Arg`]), so that
/// [`AttributeList::at`] and [`AttributeOuts::at`] read within the arrays
/// the program passed with it.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct AttributeCount(c_uint);

impl AttributeCount {
    pub fn get(self) -> c_uint {
        self.0
    }
}

impl Arg<c_uint> for AttributeCount {
    /// `raw` is the count the program passed beside the arrays.
    #[inline(always)]
    unsafe fn arg(raw: c_uint) -> Self {
        Self(raw)
    }
}

/// `cuPointerGetAttributes`' `attributes`: as many attribute numbers as
/// the call's [`AttributeCount`].
#[repr(transparent)]
pub struct AttributeList<'a>(*const c_int, PhantomData<&'a c_int>);

impl Clone for AttributeList<'_> {
    fn clone(&self) -> Self {
        *self
    }
}
impl Copy for AttributeList<'_> {}

impl AttributeList<'_> {
    /// The `i`th attribute of the call's `count`; None past the end or
    /// when NULL.
    pub fn at(self, count: AttributeCount, i: usize) -> Option<c_int> {
        if i >= count.get() as usize {
            return None;
        }
        // SAFETY: NULL or readable for the call's count of ints (`Arg`'s
        // contract for this parameter; `count` is that call's), and
        // `i < count`.
        unsafe { get(self.0.wrapping_add(i)) }
    }
}

impl Arg<*const c_int> for AttributeList<'_> {
    /// The driver API makes `attributes` valid for as many ints as the
    /// call's count says.
    #[inline(always)]
    unsafe fn arg(raw: *const c_int) -> Self {
        Self(raw, PhantomData)
    }
}

/// `cuPointerGetAttributes`' `data`: `count` out-parameters, the `i`th of
/// the type the `i`th attribute names (as [`AttributeOut`]).
#[repr(transparent)]
pub struct AttributeOuts<'a>(*mut *mut c_void, PhantomData<&'a mut ()>);

impl Clone for AttributeOuts<'_> {
    fn clone(&self) -> Self {
        *self
    }
}
impl Copy for AttributeOuts<'_> {}

impl<'a> AttributeOuts<'a> {
    /// The `i`th of the call's `count` out-parameters; None past the end
    /// or when the array is NULL.
    pub fn at(self, count: AttributeCount, i: usize) -> Option<AttributeOut<'a>> {
        if i >= count.get() as usize {
            return None;
        }
        // SAFETY: NULL or readable for the call's count of pointers
        // (`Arg`'s contract for this parameter; `count` is that call's),
        // and `i < count`.
        let p = unsafe { get(self.0.cast_const().wrapping_add(i)) }?;
        // SAFETY: each pointer is NULL or valid for its attribute's value
        // for the call (the driver API's contract, as `AttributeOut`'s).
        Some(unsafe { AttributeOut::arg(p) })
    }
}

impl Arg<*mut *mut c_void> for AttributeOuts<'_> {
    /// The driver API makes `data` valid for as many pointers as the
    /// call's count says, each NULL or valid for its attribute's value.
    #[inline(always)]
    unsafe fn arg(raw: *mut *mut c_void) -> Self {
        Self(raw, PhantomData)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribute_arrays_stop_at_their_count_and_write_values_in_their_size() {
        let attrs = [11, 10, 12];
        let (mut start, mut capable, mut size) = (0u64, [7i32; 2], 0u64);
        let mut data: [*mut c_void; 3] = [
            (&raw mut start).cast(),
            (&raw mut capable).cast(),
            (&raw mut size).cast(),
        ];
        // SAFETY: both arrays hold 3 entries (2 for `two`), each pointer
        // valid for its attribute's value.
        let (three, two, list, outs) = unsafe {
            (
                AttributeCount::arg(3),
                AttributeCount::arg(2),
                AttributeList::arg(attrs.as_ptr()),
                AttributeOuts::arg(data.as_mut_ptr()),
            )
        };
        for i in 0..3 {
            let (a, out) = (list.at(three, i).unwrap(), outs.at(three, i).unwrap());
            assert!(out.put(a, 40 + i as u64));
        }
        // Attribute 10 is an int: 4 bytes written, the next 4 kept.
        assert_eq!((start, capable, size), (40, [41, 7], 42));
        assert!(!outs.at(three, 1).unwrap().put(10, 1 << 40), "past an int");
        // MEMORY_TYPE (2): a size not known here, nothing written.
        assert!(!outs.at(three, 1).unwrap().put(2, 1));
        assert_eq!(capable, [41, 7]);
        assert!(list.at(three, 3).is_none() && outs.at(three, 3).is_none());
        assert!(list.at(two, 2).is_none());
        // SAFETY: NULL is allowed.
        let (none, nothing) = unsafe {
            (
                AttributeList::arg(std::ptr::null()),
                AttributeOuts::arg(std::ptr::null_mut()),
            )
        };
        assert!(none.at(three, 0).is_none() && nothing.at(three, 0).is_none());
    }

    #[test]
    fn out_and_in_read_write_and_answer_null() {
        let mut x = 1u64;
        let o = Out::from(&mut x);
        assert_eq!(o.get(), Some(1));
        assert!(o.put(7));
        assert_eq!(x, 7);
        // SAFETY: NULL is allowed.
        let n: Out<u64> = unsafe { Out::from_raw(std::ptr::null_mut()) };
        assert!(n.is_null() && !n.put(3) && n.get().is_none());
        assert_eq!(In::from(&x).get(), Some(7));
        // SAFETY: NULL is allowed.
        let i: In<u64> = unsafe { In::from_raw(std::ptr::null()) };
        assert!(i.is_null() && i.get().is_none());
    }
}
