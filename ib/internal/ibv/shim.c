// See shim.h. Every non-inline verb goes through a pointer resolved with
// dlvsym on the versioned name NCCL uses, so the plugin never links
// libibverbs and loads (and falls back to sockets) on hosts without rdma-core.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <stddef.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include "shim.h"

_Static_assert(sizeof(gosge) == 16, "gosge layout");
_Static_assert(sizeof(gosendwr) == 48, "gosendwr layout");
_Static_assert(sizeof(gorecvwr) == 32, "gorecvwr layout");
_Static_assert(sizeof(gowc) == 32, "gowc layout");

static void* lib;
static const char* missing_sym;

static struct ibv_device** (*p_get_device_list)(int*);
static void (*p_free_device_list)(struct ibv_device**);
static const char* (*p_get_device_name)(struct ibv_device*);
static struct ibv_context* (*p_open_device)(struct ibv_device*);
static int (*p_close_device)(struct ibv_context*);
static int (*p_query_device)(struct ibv_context*, struct ibv_device_attr*);
static int (*p_query_port)(struct ibv_context*, uint8_t, struct ibv_port_attr*);
static int (*p_query_gid)(struct ibv_context*, uint8_t, int, union ibv_gid*);
static struct ibv_pd* (*p_alloc_pd)(struct ibv_context*);
static int (*p_dealloc_pd)(struct ibv_pd*);
static struct ibv_mr* (*p_reg_mr)(struct ibv_pd*, void*, size_t, int);
static struct ibv_mr* (*p_reg_mr_iova2)(struct ibv_pd*, void*, size_t, uint64_t, unsigned int);
static struct ibv_mr* (*p_reg_dmabuf_mr)(struct ibv_pd*, uint64_t, size_t, uint64_t, int, int);
static int (*p_dereg_mr)(struct ibv_mr*);
static struct ibv_cq* (*p_create_cq)(struct ibv_context*, int, void*, struct ibv_comp_channel*, int);
static int (*p_destroy_cq)(struct ibv_cq*);
static struct ibv_qp* (*p_create_qp)(struct ibv_pd*, struct ibv_qp_init_attr*);
static int (*p_modify_qp)(struct ibv_qp*, struct ibv_qp_attr*, int);
static int (*p_destroy_qp)(struct ibv_qp*);
static int (*p_get_async_event)(struct ibv_context*, struct ibv_async_event*);
static void (*p_ack_async_event)(struct ibv_async_event*);
static int (*p_query_ece)(struct ibv_qp*, struct ibv_ece*);
static int (*p_set_ece)(struct ibv_qp*, struct ibv_ece*);
static int (*p_query_port_speed)(struct ibv_context*, uint32_t, uint64_t*);
static int (*p_fork_init)(void);
static int (*p_is_fork_initialized)(void); // enum ibv_fork_status

#define REQUIRE(ptr, name)                                   \
  do {                                                       \
    *(void**)&(ptr) = dlvsym(lib, name, "IBVERBS_1.1");      \
    if (!(ptr)) *(void**)&(ptr) = dlsym(lib, name);          \
    if (!(ptr)) { missing_sym = name; goto fail; }           \
  } while (0)
#define OPTIONAL(ptr, name, ver) (*(void**)&(ptr) = dlvsym(lib, name, ver))

int nb_load(const char* path, char* err, int errlen) {
  if (lib) return 0;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(err, errlen, "dlopen(%s): %s", path, dlerror());
    return -1;
  }
  lib = h;
  REQUIRE(p_get_device_list, "ibv_get_device_list");
  REQUIRE(p_free_device_list, "ibv_free_device_list");
  REQUIRE(p_get_device_name, "ibv_get_device_name");
  REQUIRE(p_open_device, "ibv_open_device");
  REQUIRE(p_close_device, "ibv_close_device");
  REQUIRE(p_query_device, "ibv_query_device");
  REQUIRE(p_query_port, "ibv_query_port");
  REQUIRE(p_query_gid, "ibv_query_gid");
  REQUIRE(p_alloc_pd, "ibv_alloc_pd");
  REQUIRE(p_dealloc_pd, "ibv_dealloc_pd");
  REQUIRE(p_reg_mr, "ibv_reg_mr");
  REQUIRE(p_dereg_mr, "ibv_dereg_mr");
  REQUIRE(p_create_cq, "ibv_create_cq");
  REQUIRE(p_destroy_cq, "ibv_destroy_cq");
  REQUIRE(p_create_qp, "ibv_create_qp");
  REQUIRE(p_modify_qp, "ibv_modify_qp");
  REQUIRE(p_destroy_qp, "ibv_destroy_qp");
  REQUIRE(p_get_async_event, "ibv_get_async_event");
  REQUIRE(p_ack_async_event, "ibv_ack_async_event");
  OPTIONAL(p_reg_mr_iova2, "ibv_reg_mr_iova2", "IBVERBS_1.8");
  OPTIONAL(p_reg_dmabuf_mr, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
  OPTIONAL(p_query_ece, "ibv_query_ece", "IBVERBS_1.10");
  OPTIONAL(p_set_ece, "ibv_set_ece", "IBVERBS_1.10");
  OPTIONAL(p_fork_init, "ibv_fork_init", "IBVERBS_1.1");
  OPTIONAL(p_is_fork_initialized, "ibv_is_fork_initialized", "IBVERBS_1.13");
  // Too new for the headers this builds against: declared here, and taken at
  // whatever version node the library exports it.
  *(void**)&p_query_port_speed = dlsym(lib, "ibv_query_port_speed");
  return 0;
fail:
  snprintf(err, errlen, "%s has no symbol %s (IBVERBS_1.1): not a usable libibverbs", path, missing_sym);
  dlclose(h);
  lib = NULL;
  return -1;
}

int nb_has_dmabuf(void) { return p_reg_dmabuf_mr != NULL; }
int nb_has_iova2(void) { return p_reg_mr_iova2 != NULL; }
int nb_has_ece(void) { return p_query_ece != NULL && p_set_ece != NULL; }
int nb_has_port_speed(void) { return p_query_port_speed != NULL; }
const char* nb_missing(void) { return missing_sym; }

// nb_fork_init: ibv_fork_init returns 0 or an errno value; *status is
// ibv_is_fork_initialized's answer, -1 where that verb is absent.
int nb_fork_init(int* status) {
  int r = p_fork_init ? p_fork_init() : ENOSYS;
  *status = p_is_fork_initialized ? p_is_fork_initialized() : -1;
  return r;
}

static int rc(int r) { return r == -1 ? (errno ? errno : EIO) : r; }
// RC calls a verb with errno cleared first, so that a -1 whose errno the
// library left alone (ibv_query_gid's -1 after a failed GID query) reads as
// EIO, not as whatever an earlier call on this thread left in errno.
#define RC(call) (errno = 0, rc(call))

// nb_device_names writes the NUL-separated device names into buf.
int nb_device_names(char* buf, int buflen, int* n) {
  int num = 0, off = 0;
  errno = 0;
  struct ibv_device** list = p_get_device_list(&num);
  if (!list) { *n = 0; return errno ? errno : ENOSYS; }
  int i;
  for (i = 0; i < num; i++) {
    const char* name = p_get_device_name(list[i]);
    int l = (int)strlen(name) + 1;
    if (off + l > buflen) break;
    memcpy(buf + off, name, l);
    off += l;
  }
  *n = i;
  p_free_device_list(list);
  return 0;
}

struct ibv_context* nb_open(const char* name) {
  int num = 0;
  struct ibv_device** list = p_get_device_list(&num);
  if (!list) return NULL;
  struct ibv_context* ctx = NULL;
  errno = ENODEV;
  for (int i = 0; i < num; i++) {
    if (strcmp(p_get_device_name(list[i]), name) == 0) {
      ctx = p_open_device(list[i]);
      break;
    }
  }
  int saved = errno;
  p_free_device_list(list);
  errno = saved;
  if (ctx) {
    // The async fd is polled from Go, so reads must never block.
    int fl = fcntl(ctx->async_fd, F_GETFL);
    fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
  }
  return ctx;
}

int nb_close(struct ibv_context* ctx) { return RC(p_close_device(ctx)); }

int nb_query_device(struct ibv_context* ctx, godevattr* out) {
  struct ibv_device_attr a;
  memset(&a, 0, sizeof(a));
  int r = RC(p_query_device(ctx, &a));
  if (r) return r;
  out->max_qp = a.max_qp; out->max_qp_wr = a.max_qp_wr; out->max_cqe = a.max_cqe;
  out->phys_port_cnt = a.phys_port_cnt; out->sys_image_guid = a.sys_image_guid;
  out->vendor_id = a.vendor_id; out->vendor_part_id = a.vendor_part_id;
  return 0;
}

// portattr_ex is ibv_port_attr as rdma-core 48+ declares it: active_speed_ex
// follows port_cap_flags2 (Debian 12's headers end at port_cap_flags2).
struct portattr_ex {
  struct ibv_port_attr a;
  uint32_t active_speed_ex;
};
_Static_assert(offsetof(struct portattr_ex, active_speed_ex) ==
               offsetof(struct ibv_port_attr, port_cap_flags2) + 4, "active_speed_ex offset");

int nb_query_port(struct ibv_context* ctx, int port, goportattr* out) {
  // As NCCL's wrap_ibv_query_port: the library's query_port op with the
  // extended size first, so that an XDR port's active_speed_ex (which the
  // 8-bit active_speed cannot hold) is read; a library that does not know the
  // field zeroes it. Without the op, the compat entry point.
  struct portattr_ex x;
  memset(&x, 0, sizeof(x));
  struct verbs_context* vctx = verbs_get_ctx_op(ctx, query_port);
  int r = vctx ? RC(vctx->query_port(ctx, (uint8_t)port, &x.a, sizeof(x))) : -1;
  if (r) {
    memset(&x, 0, sizeof(x));
    r = RC(p_query_port(ctx, (uint8_t)port, &x.a));
    if (r) return r;
  }
  struct ibv_port_attr a = x.a;
  out->active_speed_ex = x.active_speed_ex;
  out->state = a.state; out->max_mtu = a.max_mtu; out->active_mtu = a.active_mtu;
  out->gid_tbl_len = a.gid_tbl_len; out->lid = a.lid; out->sm_lid = a.sm_lid; out->lmc = a.lmc;
  out->active_width = a.active_width; out->active_speed = a.active_speed;
  out->link_layer = a.link_layer; out->flags = a.flags;
  return 0;
}

// nb_query_port_speed: the port's effective bandwidth in units of 100 Mb/s.
int nb_query_port_speed(struct ibv_context* ctx, int port, uint64_t* out) {
  if (!p_query_port_speed) return EOPNOTSUPP;
  return RC(p_query_port_speed(ctx, (uint32_t)port, out));
}

int nb_query_gid(struct ibv_context* ctx, int port, int index, uint8_t* gid16) {
  union ibv_gid g;
  int r = RC(p_query_gid(ctx, (uint8_t)port, index, &g));
  if (r == 0) memcpy(gid16, g.raw, 16);
  return r;
}

struct ibv_pd* nb_alloc_pd(struct ibv_context* ctx) { return p_alloc_pd(ctx); }
int nb_dealloc_pd(struct ibv_pd* pd) { return RC(p_dealloc_pd(pd)); }

struct ibv_mr* nb_reg_mr(struct ibv_pd* pd, uint64_t addr, size_t len, int access) {
  void* p = (void*)(uintptr_t)addr;
  if ((access & IBV_ACCESS_RELAXED_ORDERING) && p_reg_mr_iova2)
    return p_reg_mr_iova2(pd, p, len, addr, (unsigned)access);
  return p_reg_mr(pd, p, len, access & ~IBV_ACCESS_RELAXED_ORDERING);
}

struct ibv_mr* nb_reg_dmabuf_mr(struct ibv_pd* pd, uint64_t offset, size_t len, uint64_t iova, int fd, int access) {
  if (!p_reg_dmabuf_mr) { errno = EOPNOTSUPP; return NULL; }
  return p_reg_dmabuf_mr(pd, offset, len, iova, fd, access);
}

int nb_dereg_mr(struct ibv_mr* mr) { return RC(p_dereg_mr(mr)); }
uint32_t nb_mr_lkey(struct ibv_mr* mr) { return mr->lkey; }
uint32_t nb_mr_rkey(struct ibv_mr* mr) { return mr->rkey; }

struct ibv_cq* nb_create_cq(struct ibv_context* ctx, int cqe) { return p_create_cq(ctx, cqe, NULL, NULL, 0); }
int nb_destroy_cq(struct ibv_cq* cq) { return RC(p_destroy_cq(cq)); }

struct ibv_qp* nb_create_qp(struct ibv_pd* pd, struct ibv_cq* scq, struct ibv_cq* rcq, int max_send_wr, int max_recv_wr,
                            int max_send_sge, int max_recv_sge, int max_inline) {
  struct ibv_qp_init_attr a;
  memset(&a, 0, sizeof(a));
  a.send_cq = scq; a.recv_cq = rcq; a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = max_send_wr; a.cap.max_recv_wr = max_recv_wr;
  a.cap.max_send_sge = max_send_sge; a.cap.max_recv_sge = max_recv_sge;
  a.cap.max_inline_data = max_inline;
  return p_create_qp(pd, &a);
}

uint32_t nb_qp_num(struct ibv_qp* qp) { return qp->qp_num; }

int nb_modify_init(struct ibv_qp* qp, int pkey_index, int port, int access) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_INIT; a.pkey_index = pkey_index; a.port_num = port; a.qp_access_flags = access;
  return RC(p_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
}

int nb_modify_rtr(struct ibv_qp* qp, int mtu, uint32_t dest_qpn, uint32_t rq_psn, int max_dest_rd_atomic, int min_rnr_timer,
                  int is_global, const uint8_t* dgid, int sgid_index, int hop_limit, int traffic_class, uint32_t flow_label,
                  int dlid, int sl, int port) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR; a.path_mtu = mtu; a.dest_qp_num = dest_qpn; a.rq_psn = rq_psn;
  a.max_dest_rd_atomic = max_dest_rd_atomic; a.min_rnr_timer = min_rnr_timer;
  a.ah_attr.is_global = is_global;
  if (is_global) {
    memcpy(a.ah_attr.grh.dgid.raw, dgid, 16);
    a.ah_attr.grh.sgid_index = sgid_index; a.ah_attr.grh.hop_limit = hop_limit;
    a.ah_attr.grh.traffic_class = traffic_class; a.ah_attr.grh.flow_label = flow_label;
  }
  a.ah_attr.dlid = dlid; a.ah_attr.sl = sl; a.ah_attr.src_path_bits = 0; a.ah_attr.port_num = port;
  return RC(p_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
}

int nb_modify_rts(struct ibv_qp* qp, int timeout, int retry_cnt, int rnr_retry, uint32_t sq_psn, int max_rd_atomic) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS; a.timeout = timeout; a.retry_cnt = retry_cnt; a.rnr_retry = rnr_retry;
  a.sq_psn = sq_psn; a.max_rd_atomic = max_rd_atomic;
  return RC(p_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                    IBV_QP_MAX_QP_RD_ATOMIC));
}

int nb_destroy_qp(struct ibv_qp* qp) { return RC(p_destroy_qp(qp)); }

int nb_query_ece(struct ibv_qp* qp, uint32_t* out3) {
  if (!p_query_ece) return EOPNOTSUPP;
  struct ibv_ece e;
  memset(&e, 0, sizeof(e));
  int r = RC(p_query_ece(qp, &e));
  out3[0] = e.vendor_id; out3[1] = e.options; out3[2] = e.comp_mask;
  return r;
}

int nb_set_ece(struct ibv_qp* qp, const uint32_t* in3) {
  if (!p_set_ece) return EOPNOTSUPP;
  struct ibv_ece e = {.vendor_id = in3[0], .options = in3[1], .comp_mask = in3[2]};
  return RC(p_set_ece(qp, &e));
}

#define CHAIN 32

// LINK_WR sets what send and receive work requests share: the id, the SGE
// (none when num_sge is 0) and the link to the next WR of a k-long chain.
#define LINK_WR(w, s, g, i, k)                                                   \
  do {                                                                           \
    (w)[i].wr_id = (g)->wr_id;                                                   \
    (w)[i].next = (i) + 1 < (k) ? &(w)[(i) + 1] : NULL;                          \
    (s)[i].addr = (g)->sge.addr;                                                 \
    (s)[i].length = (g)->sge.length;                                             \
    (s)[i].lkey = (g)->sge.lkey;                                                 \
    (w)[i].sg_list = (g)->num_sge ? &(s)[i] : NULL;                              \
    (w)[i].num_sge = (g)->num_sge;                                               \
  } while (0)

// post_chains posts n WRs, sends (sw) or receives (rw, when sw is NULL), in
// chains of up to CHAIN WRs built on the stack. On failure *bad is the index
// of the first WR not posted.
static int post_chains(struct ibv_qp* qp, const gosendwr* sw, const gorecvwr* rw, int n, int* bad) {
  struct ibv_sge s[CHAIN];
  for (int base = 0; base < n; base += CHAIN) {
    int k = n - base < CHAIN ? n - base : CHAIN, r, posted;
    if (sw) {
      struct ibv_send_wr w[CHAIN], *badwr = NULL;
      memset(w, 0, sizeof(struct ibv_send_wr) * k);
      for (int i = 0; i < k; i++) {
        const gosendwr* g = &sw[base + i];
        LINK_WR(w, s, g, i, k);
        w[i].opcode = (enum ibv_wr_opcode)g->opcode;
        w[i].send_flags = g->flags;
        w[i].imm_data = htonl(g->imm);
        w[i].wr.rdma.remote_addr = g->remote_addr;
        w[i].wr.rdma.rkey = g->rkey;
      }
      r = ibv_post_send(qp, w, &badwr);
      posted = badwr ? (int)(badwr - w) : 0;
    } else {
      struct ibv_recv_wr w[CHAIN], *badwr = NULL;
      memset(w, 0, sizeof(struct ibv_recv_wr) * k);
      for (int i = 0; i < k; i++) LINK_WR(w, s, &rw[base + i], i, k);
      r = ibv_post_recv(qp, w, &badwr);
      posted = badwr ? (int)(badwr - w) : 0;
    }
    if (r) {
      *bad = base + posted;
      return r;
    }
  }
  *bad = n;
  return 0;
}

int nb_post_send(struct ibv_qp* qp, const gosendwr* wrs, int n, int* bad) { return post_chains(qp, wrs, NULL, n, bad); }

int nb_post_recv(struct ibv_qp* qp, const gorecvwr* wrs, int n, int* bad) { return post_chains(qp, NULL, wrs, n, bad); }

int nb_poll_cq(struct ibv_cq* cq, gowc* out, int n) {
  struct ibv_wc wc[CHAIN];
  int total = 0;
  while (total < n) {
    int want = n - total < CHAIN ? n - total : CHAIN;
    int got = ibv_poll_cq(cq, want, wc);
    if (got < 0) return total ? total : -EIO;
    for (int i = 0; i < got; i++) {
      gowc* g = &out[total + i];
      g->wr_id = wc[i].wr_id;
      g->qp_num = wc[i].qp_num; g->vendor_err = wc[i].vendor_err;
      g->status = (uint8_t)wc[i].status;
      if (wc[i].status != IBV_WC_SUCCESS) {
        /* Only wr_id, status, qp_num and vendor_err are valid in an error
         * completion (ibv_poll_cq(3)); mlx5 leaves the rest as it was. */
        g->byte_len = 0; g->with_imm = 0; g->imm = 0; g->opcode = 0;
        continue;
      }
      g->byte_len = wc[i].byte_len;
      g->with_imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) != 0;
      g->imm = g->with_imm ? ntohl(wc[i].imm_data) : 0;
      g->opcode = (uint8_t)wc[i].opcode;
    }
    total += got;
    if (got < want) break;
  }
  return total;
}

int nb_async_fd(struct ibv_context* ctx) { return ctx->async_fd; }

// nb_decode_event copies what the plugin reads from an event, with the union
// read as libibverbs' ibv_get_async_event fills it: a CQ for CQ_ERR, a QP for
// the QP events, an SRQ or WQ for theirs, and the port number for every other
// type, IBV_EVENT_DEVICE_SPEED_CHANGE (newer than these headers) and any
// later one included.
void nb_decode_event(const struct ibv_async_event* ev, goevent* out) {
  out->type = ev->event_type; out->qp_num = 0; out->cq = 0; out->port = 0;
  switch (ev->event_type) {
    case IBV_EVENT_QP_FATAL: case IBV_EVENT_QP_REQ_ERR: case IBV_EVENT_QP_ACCESS_ERR: case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED: case IBV_EVENT_PATH_MIG: case IBV_EVENT_PATH_MIG_ERR: case IBV_EVENT_QP_LAST_WQE_REACHED:
      out->qp_num = ev->element.qp ? ev->element.qp->qp_num : 0;
      break;
    case IBV_EVENT_CQ_ERR:
      out->cq = (uint64_t)(uintptr_t)ev->element.cq;
      break;
    case IBV_EVENT_SRQ_ERR: case IBV_EVENT_SRQ_LIMIT_REACHED: case IBV_EVENT_WQ_FATAL:
      break;
    default:
      out->port = ev->element.port_num;
      break;
  }
}

// nb_get_async_event returns 1 with an event (already acknowledged: the
// fields are copied first), 0 when none is pending, or -errno.
int nb_get_async_event(struct ibv_context* ctx, goevent* out) {
  struct ibv_async_event ev;
  errno = 0;
  if (p_get_async_event(ctx, &ev) != 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return errno ? -errno : -EIO;
  }
  nb_decode_event(&ev, out);
  p_ack_async_event(&ev);
  return 1;
}

// nb_decode_test_event decodes an event of type t whose element is port
// (tests: the decode without a device).
void nb_decode_test_event(int t, int port, goevent* out) {
  struct ibv_async_event ev;
  memset(&ev, 0, sizeof(ev));
  ev.event_type = (enum ibv_event_type)t;
  ev.element.port_num = port;
  nb_decode_event(&ev, out);
}
