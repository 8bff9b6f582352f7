//! Zeroing and copying map memory a word at a time.
//!
//! Adjacent stores of zeros and struct copies compile to calls of
//! compiler_builtins' `memset`/`memmove`, which on the BPF target are
//! byte-at-a-time loops: 16 bytes of a sample header cost some 70
//! instructions, a 32-byte mapping copy in the unwinder's loop about 130.
//! Volatile accesses keep LLVM from merging the stores back into those
//! calls.

/// Writes `value` to `place` as one store.
#[inline(always)]
pub fn set<T>(place: *mut T, value: T) {
    // SAFETY: the caller's pointer is to a live, aligned field.
    unsafe { core::ptr::write_volatile(place, value) };
}

/// Copies a `T` (a whole number of 8-byte words, 8-byte aligned) word by
/// word.
#[inline(always)]
pub fn copy<T>(to: *mut T, from: *const T) {
    const { assert!(core::mem::size_of::<T>() % 8 == 0 && core::mem::align_of::<T>() >= 8) };
    let (to, from) = (to.cast::<u64>(), from.cast::<u64>());
    for i in 0..core::mem::size_of::<T>() / 8 {
        // SAFETY: both point at whole, aligned `T`s (asserted above).
        unsafe { core::ptr::write_volatile(to.add(i), core::ptr::read_volatile(from.add(i))) };
    }
}
