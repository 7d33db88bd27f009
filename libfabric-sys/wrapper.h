#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_trigger.h>
#include <rdma/providers/fi_prov.h>
#include <rdma/providers/fi_log.h>

/* libfabric 2.x marks the names it deprecated with _Pragma("GCC warning ..."),
 * which bindgen cannot evaluate: they would vanish from the bindings. Their
 * values are part of the ABI (applications built against 1.x still pass them),
 * so the bindings keep them, without the pragma. */
#if FI_MAJOR_VERSION >= 2
#undef FI_MR_UNSPEC
#define FI_MR_UNSPEC 0
#undef FI_MR_BASIC
#define FI_MR_BASIC (1 << 0)
#undef FI_MR_SCALABLE
#define FI_MR_SCALABLE (1 << 1)
#undef FI_ORDER_NONE
#define FI_ORDER_NONE 0ULL
#undef FI_ORDER_STRICT
#define FI_ORDER_STRICT 0x1FF
#undef FI_ORDER_DATA
#define FI_ORDER_DATA (1ULL << 16)
#undef FI_LOCAL_MR
#define FI_LOCAL_MR (1ULL << 55)
#undef FI_REG_MR
#define FI_REG_MR (1ULL << 59)
#endif
