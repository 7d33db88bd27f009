#include <infiniband/verbs.h>
#include <infiniband/efadv.h>
