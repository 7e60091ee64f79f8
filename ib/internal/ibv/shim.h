// C side of package ibv: libibverbs resolved with dlopen/dlvsym (never linked),
// and the static-inline data-path verbs compiled against <infiniband/verbs.h>,
// batched so Go crosses into C once per chain of work requests or CQ poll.
#ifndef NCCL_GO_IBV_SHIM_H
#define NCCL_GO_IBV_SHIM_H
#include <stdint.h>
#include <stddef.h>
#include <infiniband/verbs.h>

// These mirror verbs.SGE / SendWR / RecvWR / WC in Go; sizes are asserted in
// shim.c and the Go side checks unsafe.Sizeof at init.
typedef struct { uint64_t addr; uint32_t length; uint32_t lkey; } gosge;
typedef struct {
  uint64_t wr_id; gosge sge; uint64_t remote_addr; uint32_t rkey; uint32_t imm;
  uint8_t opcode; uint8_t flags; uint8_t num_sge; uint8_t pad[5];
} gosendwr;
typedef struct { uint64_t wr_id; gosge sge; uint8_t num_sge; uint8_t pad[7]; } gorecvwr;
typedef struct {
  uint64_t wr_id; uint32_t byte_len; uint32_t imm; uint32_t qp_num; uint32_t vendor_err;
  uint8_t status; uint8_t opcode; uint8_t with_imm; uint8_t pad[5];
} gowc;

typedef struct {
  int max_qp, max_qp_wr, max_cqe, phys_port_cnt;
  uint64_t sys_image_guid;
  uint32_t vendor_id, vendor_part_id;
} godevattr;

typedef struct {
  int state, max_mtu, active_mtu, gid_tbl_len;
  uint16_t lid, sm_lid;
  uint8_t lmc, active_width, active_speed, link_layer, flags;
  uint32_t active_speed_ex;
} goportattr;

typedef struct { int type; uint32_t qp_num; uint64_t cq; int port; } goevent;

int nb_load(const char* path, char* err, int errlen);
int nb_has_dmabuf(void);
int nb_has_iova2(void);
int nb_has_ece(void);
int nb_has_port_speed(void);
int nb_fork_init(int* status);
const char* nb_missing(void);

int nb_device_names(char* buf, int buflen, int* n);
struct ibv_context* nb_open(const char* name);
int nb_close(struct ibv_context* ctx);
int nb_query_device(struct ibv_context* ctx, godevattr* out);
int nb_query_port(struct ibv_context* ctx, int port, goportattr* out);
int nb_query_port_speed(struct ibv_context* ctx, int port, uint64_t* out);
int nb_query_gid(struct ibv_context* ctx, int port, int index, uint8_t* gid16);
struct ibv_pd* nb_alloc_pd(struct ibv_context* ctx);
int nb_dealloc_pd(struct ibv_pd* pd);
struct ibv_mr* nb_reg_mr(struct ibv_pd* pd, uint64_t addr, size_t len, int access);
struct ibv_mr* nb_reg_dmabuf_mr(struct ibv_pd* pd, uint64_t offset, size_t len, uint64_t iova, int fd, int access);
int nb_dereg_mr(struct ibv_mr* mr);
uint32_t nb_mr_lkey(struct ibv_mr* mr);
uint32_t nb_mr_rkey(struct ibv_mr* mr);
struct ibv_cq* nb_create_cq(struct ibv_context* ctx, int cqe);
int nb_destroy_cq(struct ibv_cq* cq);
struct ibv_qp* nb_create_qp(struct ibv_pd* pd, struct ibv_cq* scq, struct ibv_cq* rcq, int max_send_wr, int max_recv_wr, int max_send_sge, int max_recv_sge, int max_inline);
uint32_t nb_qp_num(struct ibv_qp* qp);
int nb_modify_init(struct ibv_qp* qp, int pkey_index, int port, int access);
int nb_modify_rtr(struct ibv_qp* qp, int mtu, uint32_t dest_qpn, uint32_t rq_psn, int max_dest_rd_atomic, int min_rnr_timer,
                  int is_global, const uint8_t* dgid, int sgid_index, int hop_limit, int traffic_class, uint32_t flow_label,
                  int dlid, int sl, int port);
int nb_modify_rts(struct ibv_qp* qp, int timeout, int retry_cnt, int rnr_retry, uint32_t sq_psn, int max_rd_atomic);
int nb_destroy_qp(struct ibv_qp* qp);
int nb_query_ece(struct ibv_qp* qp, uint32_t* out3);
int nb_set_ece(struct ibv_qp* qp, const uint32_t* in3);
int nb_post_send(struct ibv_qp* qp, const gosendwr* wrs, int n, int* bad);
int nb_post_recv(struct ibv_qp* qp, const gorecvwr* wrs, int n, int* bad);
int nb_poll_cq(struct ibv_cq* cq, gowc* out, int n);
int nb_async_fd(struct ibv_context* ctx);
int nb_get_async_event(struct ibv_context* ctx, goevent* out);
void nb_decode_event(const struct ibv_async_event* ev, goevent* out);
void nb_decode_test_event(int t, int port, goevent* out);
#endif
