//! Finds a symbol in libc's dynamic symbol table by walking the loaded
//! image (`dl_iterate_phdr`, GNU or SysV hash).
//!
//! We export `dlsym` and `dlvsym` ourselves, so any call to either from this
//! library would reach our own export again: the real ones are found here,
//! without calling any symbol lookup function. libc is never unloaded, so
//! the tables read here stay mapped for the life of the process.

use std::ffi::{CStr, c_int, c_void};

const PT_DYNAMIC: u32 = 2;
const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
/// Bit of a `versym` entry marking a non-default (hidden) version.
const VERSYM_HIDDEN: u16 = 0x8000;

#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

/// The address of `name` in libc (default version preferred), if found.
pub fn libc_symbol(name: &CStr) -> Option<*mut c_void> {
    let mut search = Search {
        name: name.to_bytes(),
        found: None,
    };
    // SAFETY: the callback only reads the phdr info glibc passes it, and
    // `search` outlives the call.
    unsafe {
        libc::dl_iterate_phdr(Some(visit), (&raw mut search).cast());
    }
    search.found
}

struct Search<'a> {
    name: &'a [u8],
    found: Option<*mut c_void>,
}

fn is_libc(object: &[u8]) -> bool {
    let file = object.rsplit(|&b| b == b'/').next().unwrap_or(object);
    file == b"libc.so.6" || file == b"libdl.so.2"
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: glibc passes a valid dl_phdr_info for the duration of the call,
    // and `data` is the Search that libc_symbol handed to dl_iterate_phdr.
    let (info, search) = unsafe { (&*info, &mut *data.cast::<Search<'_>>()) };
    let object = if info.dlpi_name.is_null() {
        &b""[..]
    } else {
        // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes()
    };
    if !is_libc(object) {
        return 0;
    }
    // SAFETY: the object is libc, mapped for the life of the process; its
    // program headers and dynamic section are what the loader itself uses.
    match unsafe { lookup(info, search.name) } {
        Some(p) => {
            search.found = Some(p);
            1
        }
        None => 0,
    }
}

/// # Safety
/// `info` must describe a loaded ELF64 object that stays mapped.
unsafe fn lookup(info: &libc::dl_phdr_info, name: &[u8]) -> Option<*mut c_void> {
    let base = info.dlpi_addr;
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let dynamic = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC)?;
    // glibc relocates these entries in place; vDSO-like images do not.
    let abs = |v: u64| if v < base { base + v } else { v };
    let (mut strtab, mut symtab, mut gnu_hash, mut hash, mut versym) = (0, 0, 0, 0, 0);
    let mut d = (base + dynamic.p_vaddr) as *const Dyn;
    loop {
        // SAFETY: the dynamic section is an array of Dyn ending in DT_NULL.
        let entry = unsafe { &*d };
        match entry.tag {
            DT_NULL => break,
            DT_STRTAB => strtab = abs(entry.val),
            DT_SYMTAB => symtab = abs(entry.val),
            DT_GNU_HASH => gnu_hash = abs(entry.val),
            DT_HASH => hash = abs(entry.val),
            DT_VERSYM => versym = abs(entry.val),
            _ => {}
        }
        // SAFETY: not past DT_NULL yet.
        d = unsafe { d.add(1) };
    }
    if strtab == 0 || symtab == 0 {
        return None;
    }
    let table = Tables {
        base,
        strtab: strtab as *const u8,
        symtab: symtab as *const Sym,
        versym: versym as *const u16,
    };
    // SAFETY: the tables come from the object's own dynamic section.
    unsafe {
        if gnu_hash != 0 {
            table.gnu_lookup(gnu_hash as *const u32, name)
        } else if hash != 0 {
            table.sysv_lookup(hash as *const u32, name)
        } else {
            None
        }
    }
}

struct Tables {
    base: u64,
    strtab: *const u8,
    symtab: *const Sym,
    versym: *const u16,
}

/// What a symbol table entry offers for `name`.
enum Match {
    No,
    Default(*mut c_void),
    Hidden(*mut c_void),
}

impl Tables {
    /// # Safety
    /// `i` must index the symbol table.
    unsafe fn check(&self, i: usize, name: &[u8]) -> Match {
        // SAFETY: the caller guarantees `i` is in the table.
        let sym = unsafe { &*self.symtab.add(i) };
        if sym.shndx == 0 || sym.value == 0 {
            return Match::No;
        }
        // SAFETY: st_name is an offset into the NUL-terminated string table.
        let sym_name = unsafe { CStr::from_ptr(self.strtab.add(sym.name as usize).cast()) };
        if sym_name.to_bytes() != name {
            return Match::No;
        }
        let addr = (self.base + sym.value) as *mut c_void;
        // SAFETY: versym, when present, has one entry per symbol.
        let hidden = !self.versym.is_null() && unsafe { *self.versym.add(i) } & VERSYM_HIDDEN != 0;
        if hidden {
            Match::Hidden(addr)
        } else {
            Match::Default(addr)
        }
    }

    /// # Safety
    /// `gh` must be the object's DT_GNU_HASH table.
    unsafe fn gnu_lookup(&self, gh: *const u32, name: &[u8]) -> Option<*mut c_void> {
        let h = name.iter().fold(5381u32, |h, &c| {
            h.wrapping_mul(33).wrapping_add(u32::from(c))
        });
        // SAFETY: the GNU hash header is four u32s: nbuckets, symoffset,
        // bloom size (in u64 words), bloom shift; buckets and chains follow.
        unsafe {
            let (nbuckets, symoffset, bloom_words) = (*gh, *gh.add(1), *gh.add(2));
            if nbuckets == 0 {
                return None;
            }
            let buckets = gh.add(4 + 2 * bloom_words as usize);
            let chains = buckets.add(nbuckets as usize);
            let mut i = *buckets.add((h % nbuckets) as usize);
            if i < symoffset {
                return None;
            }
            let mut hidden = None;
            loop {
                let ch = *chains.add((i - symoffset) as usize);
                if ch | 1 == h | 1 {
                    match self.check(i as usize, name) {
                        Match::Default(p) => return Some(p),
                        Match::Hidden(p) => hidden = hidden.or(Some(p)),
                        Match::No => {}
                    }
                }
                if ch & 1 != 0 {
                    return hidden;
                }
                i += 1;
            }
        }
    }

    /// # Safety
    /// `h` must be the object's DT_HASH table.
    unsafe fn sysv_lookup(&self, h: *const u32, name: &[u8]) -> Option<*mut c_void> {
        // SAFETY: the SysV hash header's second word is the symbol count.
        let nsyms = unsafe { *h.add(1) } as usize;
        let mut hidden = None;
        for i in 0..nsyms {
            // SAFETY: i < the symbol count.
            match unsafe { self.check(i, name) } {
                Match::Default(p) => return Some(p),
                Match::Hidden(p) => hidden = hidden.or(Some(p)),
                Match::No => {}
            }
        }
        hidden
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_libc_functions_at_their_real_addresses() {
        // In the unit-test binary nothing interposes, so libc's own
        // addresses are what the linker bound.
        let getpid = libc_symbol(c"getpid").expect("getpid in libc");
        assert_eq!(getpid as usize, libc::getpid as *const () as usize);
        let dlsym = libc_symbol(c"dlsym").expect("dlsym in libc");
        assert_eq!(dlsym as usize, libc::dlsym as *const () as usize);
        assert!(libc_symbol(c"vgpu_no_such_symbol").is_none());
    }
}
