/* net.h: umbrella header for every NCCL net plugin API version libnccl-net-go speaks. */
#ifndef NCCL_GO_NET_H
#define NCCL_GO_NET_H
#include "net_common.h"
#include "net_v8.h"
#include "net_v9.h"
#include "net_v10.h"
#include "net_v11.h"
#include "net_v12.h"
#include "net_asserts.h"
#endif
