//! The process's UCX context and how it is configured (and where UCX writes its log).

#[allow(unused_imports)]
use super::*;

/// How the context is configured. Each field is a UCX configuration variable set with
/// `ucp_config_modify`; `None` leaves UCX's default (and its `UCX_*` environment variable).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// `TLS`: the transports UCX may use, e.g. `"shm,cma,tcp"` or `"rc,ud,sm,self"`.
    pub tls: Option<String>,
    /// `NET_DEVICES`: network devices to use, e.g. `"veth1"` or `"mlx5_0:1"`.
    pub net_devices: Option<String>,
    /// `MM_FIFO_SIZE`: entries in each shared-memory receive FIFO (UCX's default is 64).
    pub mm_fifo_size: Option<u32>,
}

/// Sends UCX's own log lines (its warnings and errors) to stderr, once per process, unless
/// `UCX_LOG_FILE` says where: UCX writes them to stdout by default, where `trireme nbd` and
/// `attach` print what scripts read (their URIs). Done before the first context, while no UCX
/// thread logs.
fn log_to_stderr() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("UCX_LOG_FILE").is_some() {
            return;
        }
        let (name, value) = (c"LOG_FILE", c"stderr");
        // SAFETY: both are NUL-terminated strings that outlive the call; the log is closed and
        // opened again on the option's new value before any worker exists.
        unsafe {
            if sys::ucs_global_opts_set_value(name.as_ptr(), value.as_ptr()) == sys::UCS_OK {
                sys::ucs_log_cleanup();
                sys::ucs_log_init();
            }
        }
    });
}

/// The process's UCX context (`ucp_context_h`).
#[derive(Debug)]
pub struct Context {
    pub(crate) h: sys::ucp_context_h,
}

// SAFETY: the context is created with `mt_workers_shared`, which makes UCX lock what workers
// on different threads share; nothing else touches the handle after creation but cleanup.
unsafe impl Send for Context {}
// SAFETY: as above; `&Context` only creates workers, which UCX allows from any thread.
unsafe impl Sync for Context {}

impl Context {
    pub fn new(cfg: &Config) -> Result<Arc<Context>, Error> {
        log_to_stderr();
        let mut conf: *mut sys::ucp_config_t = ptr::null_mut();
        // SAFETY: NULL prefix and file mean the defaults; `conf` receives a new descriptor.
        check("config read", unsafe {
            sys::ucp_config_read(ptr::null(), ptr::null(), &mut conf)
        })?;
        let set = |name: &str, value: &str| -> Result<(), Error> {
            let (n, v) = (
                CString::new(name).expect("no NUL in a UCX variable name"),
                CString::new(value).map_err(|_| Error {
                    what: "config",
                    status: sys::UCS_ERR_INVALID_PARAM as i32,
                    message: format!("{name} value {value:?} holds a NUL byte"),
                })?,
            );
            // SAFETY: `conf` is the live descriptor read above; both strings outlive the call.
            check("config modify", unsafe {
                sys::ucp_config_modify(conf, n.as_ptr(), v.as_ptr())
            })
        };
        let applied = (|| {
            // Workers are shared between threads; UCX's default lock is a spinlock, which on
            // an oversubscribed host spins for a whole time slice when its holder is preempted.
            set("USE_MT_MUTEX", "y")?;
            if let Some(t) = &cfg.tls {
                set("TLS", t)?;
            }
            if let Some(d) = &cfg.net_devices {
                set("NET_DEVICES", d)?;
            }
            if let Some(n) = cfg.mm_fifo_size {
                set("MM_FIFO_SIZE", &n.to_string())?;
            }
            Ok(())
        })();
        if let Err(e) = applied {
            // SAFETY: `conf` came from ucp_config_read and is released once.
            unsafe { sys::ucp_config_release(conf) };
            return Err(e);
        }
        let params = sys::ucp_params_t {
            field_mask: (sys::UCP_PARAM_FIELD_FEATURES | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED)
                as u64,
            // WAKEUP: the event fd that lets a worker thread sleep instead of spinning.
            features: (sys::UCP_FEATURE_AM | sys::UCP_FEATURE_WAKEUP) as u64,
            mt_workers_shared: 1,
            ..Default::default()
        };
        let mut h: sys::ucp_context_h = ptr::null_mut();
        // SAFETY: `params` and `conf` are valid for the call; `h` receives the context. This is
        // what the `ucp_init` inline function of the header does.
        let s = unsafe {
            sys::ucp_init_version(
                sys::UCP_API_MAJOR,
                sys::UCP_API_MINOR,
                &params,
                conf,
                &mut h,
            )
        };
        // SAFETY: `conf` is no longer needed once the context is created (or not).
        unsafe { sys::ucp_config_release(conf) };
        check("init", s)?;
        Ok(Arc::new(Context { h }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every worker holds an `Arc<Context>`, so none is left when this runs.
        unsafe { sys::ucp_cleanup(self.h) };
    }
}
