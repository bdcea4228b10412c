//! Generates the bindings from the headers of the UCX the system has (Debian `libucx-dev`),
//! found through pkg-config, and links against it. Only the `ucp_*`/`ucs_*` API is bound.

fn main() {
    let ucx = pkg_config::Config::new()
        .atleast_version("1.12")
        .probe("ucx")
        .unwrap_or_else(|e| {
            panic!("UCX not found through pkg-config ({e}); install libucx-dev (scripts/setup.sh)")
        });
    // pkg-config's `ucx` names ucp, uct and ucs; the AM and worker API lives in ucp.
    println!("cargo:rustc-link-lib=ucp");
    println!("cargo:rustc-link-lib=ucs");
    println!("cargo:rerun-if-changed=wrapper.h");
    let mut b = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("ucp_.*")
        .allowlist_function("ucs_status_string")
        .allowlist_function("ucs_global_opts_set_value")
        .allowlist_function("ucs_log_init")
        .allowlist_function("ucs_log_cleanup")
        .allowlist_type("ucp_.*")
        .allowlist_type("ucs_.*")
        .allowlist_var("UCP_.*")
        .allowlist_var("UCS_.*")
        .allowlist_var("UCP_API_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for p in &ucx.include_paths {
        b = b.clang_arg(format!("-I{}", p.display()));
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    b.generate()
        .expect("bindgen could not read the UCX headers")
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings");
}
