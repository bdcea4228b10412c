#include <ucp/api/ucp.h>
/* Where UCX writes its log: `ucs_global_opts_set_value`, `ucs_log_init`, `ucs_log_cleanup`. */
#include <ucs/config/global_opts.h>
#include <ucs/debug/log_def.h>
