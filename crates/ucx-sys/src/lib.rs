//! Raw bindings to the system UCX (`ucp`/`ucs`), generated at build time from its headers.
//!
//! Nothing here is safe to call directly; `trireme-ucx` wraps it. The few helpers below are
//! the C API's macros, which bindgen cannot translate.

#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code
)]
#![allow(clippy::all, clippy::undocumented_unsafe_blocks)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// `UCS_PTR_IS_ERR`: a status pointer that carries an error code.
pub fn ucs_ptr_is_err(p: ucs_status_ptr_t) -> bool {
    (p as usize) >= (UCS_ERR_LAST as isize as usize)
}

/// `UCS_PTR_IS_PTR`: a status pointer that is a request handle.
pub fn ucs_ptr_is_ptr(p: ucs_status_ptr_t) -> bool {
    (p as usize).wrapping_sub(1) < (UCS_ERR_LAST as isize as usize).wrapping_sub(1)
}

/// `UCS_PTR_STATUS`: the status a status pointer carries (`UCS_OK` for NULL,
/// `UCS_INPROGRESS` for a request handle).
pub fn ucs_ptr_status(p: ucs_status_ptr_t) -> ucs_status_t {
    if ucs_ptr_is_ptr(p) {
        UCS_INPROGRESS
    } else {
        p as isize as ucs_status_t
    }
}

/// `ucp_dt_make_contig(1)`: a contiguous buffer of bytes.
pub const DT_BYTES: ucp_datatype_t =
    (1 << UCP_DATATYPE_SHIFT) | UCP_DATATYPE_CONTIG as ucp_datatype_t;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_links_and_reports_its_version() {
        let (mut a, mut b, mut c) = (0u32, 0u32, 0u32);
        // SAFETY: the three pointers are valid for writes for the duration of the call.
        unsafe { ucp_get_version(&mut a, &mut b, &mut c) };
        assert!(a >= 1 && (a > 1 || b >= 12), "UCX {a}.{b}.{c}");
    }

    #[test]
    fn status_pointers_decode() {
        assert!(!ucs_ptr_is_err(std::ptr::null_mut()));
        assert!(!ucs_ptr_is_ptr(std::ptr::null_mut()));
        let e = UCS_ERR_NO_MEMORY as isize as ucs_status_ptr_t;
        assert!(ucs_ptr_is_err(e));
        assert!(!ucs_ptr_is_ptr(e));
        assert_eq!(ucs_ptr_status(e), UCS_ERR_NO_MEMORY);
        let mut x = 0u64;
        let p = &mut x as *mut u64 as ucs_status_ptr_t;
        assert!(ucs_ptr_is_ptr(p) && !ucs_ptr_is_err(p));
    }
}
