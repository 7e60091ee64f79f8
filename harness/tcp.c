/* tcp.c: plain TCP over loopback, the baselines bench compares the plugin with: blocking
 * send/recv, and busy-polled non-blocking send/recv (the latency floor a polling loop can reach). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

static void nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int tcp_listen(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  if (bind(fd, (struct sockaddr*)&a, sizeof a) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, (struct sockaddr*)&a, &al) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

int tcp_accept(int lfd, double timeout_s) {
  struct pollfd p = {lfd, POLLIN, 0};
  if (poll(&p, 1, (int)(timeout_s * 1000)) != 1) return -1;
  int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (fd >= 0) nodelay(fd);
  return fd;
}

int tcp_connect(int port, double timeout_s) {
  uint64_t until = now_ns() + (uint64_t)(timeout_s * 1e9);
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr*)&a, sizeof a) == 0) {
      nodelay(fd);
      return fd;
    }
    close(fd);
    if (now_ns() > until) return -1;
    sleep_ms(10);
  }
}

/* The send side only reads the buffer: sock_io_all takes void* for both. */
int tcp_send_all(int fd, const void* buf, size_t len) { return sock_io_all(fd, (void*)buf, len, true, 0); }

int tcp_recv_all(int fd, void* buf, size_t len) { return sock_io_all(fd, buf, len, false, 0); }

/* The busy-polled variants: MSG_DONTWAIT on every call, sched_yield() when the
 * socket had nothing, the same loop shape as the plugin's NCCL-style polling. */
int tcp_send_poll(int fd, const void* buf, size_t len) { return sock_io_all(fd, (void*)buf, len, true, MSG_DONTWAIT); }

int tcp_recv_poll(int fd, void* buf, size_t len) { return sock_io_all(fd, buf, len, false, MSG_DONTWAIT); }
