package ib

import (
	"net/netip"
	"strings"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/ibv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// config is every setting the transport reads. It is read once, by Init, as
// NCCL reads its NCCL_PARAMs once per process: a value changed afterwards
// does not change a running job, and no data-path call ever reads the
// environment. docs/ib.md lists each variable against what NCCL 2.30 does.
// (NCCL_SOCKET_IFNAME and NCCL_SOCKET_FAMILY are read by findOOBInterface,
// NCCL_IB_HCA is read by readHCAFilter, with the grammar of internal/ncclenv.)
type config struct {
	// Discovery.
	disable      bool      // NCCL_IB_DISABLE
	ibverbsLib   string    // NCCL_IBVERBS_LIB
	hca          hcaFilter // NCCL_IB_HCA
	hcaSpec      string    // its value, "" when unset
	gid          gidConfig
	pciOrder     bool // NCCL_IB_DEVICE_PCI_ORDER
	mergeVFs     bool // NCCL_IB_MERGE_VFS
	mergeNICs    bool // NCCL_IB_MERGE_NICS
	dmabuf       bool // NCCL_DMABUF_ENABLE
	relaxedOrder int  // NCCL_IB_PCI_RELAXED_ORDERING: 0 off, 1 and 2 on when ibv_reg_mr_iova2 exists
	adaptive     int  // NCCL_IB_ADAPTIVE_ROUTING: -2 per link layer (IB on, RoCE off), else 0/1
	arThreshold  int  // NCCL_IB_AR_THRESHOLD (bytes)

	// Connections.
	qpsPerConn  int  // NCCL_IB_QPS_PER_CONNECTION, 1..128
	splitData   bool // NCCL_IB_SPLIT_DATA_ON_QPS
	pkey        int  // NCCL_IB_PKEY (index)
	ackTimeout  int  // NCCL_IB_TIMEOUT
	retryCnt    int  // NCCL_IB_RETRY_CNT
	tc, sl      int  // NCCL_IB_TC, NCCL_IB_SL (-1: the communicator's traffic class, else 0)
	fifoTC      int  // NCCL_IB_FIFO_TC (-1: the sender's tc)
	ece         bool // NCCL_IB_ECE_ENABLE
	useInline   bool // NCCL_IB_USE_INLINE
	returnAsync bool // NCCL_IB_RETURN_ASYNC_EVENTS
	forceFlush  bool // NCCL_GO_IB_FORCE_FLUSH (ours)
	noFlush     bool // NCCL_GDR_FLUSH_DISABLE

	// Out-of-band handshake.
	magic      uint64        // NCCL_SOCKET_MAGIC
	dialRetry  int           // NCCL_SOCKET_RETRY_CNT
	dialSleep  time.Duration // NCCL_SOCKET_RETRY_SLEEP_MSEC
	peerTime   time.Duration // NCCL_GO_TIMEOUT: dead-peer detection (0: off)
	setupLimit time.Duration // bound on one connection set-up: NCCL_GO_TIMEOUT, or its default when that is off
}

// The adaptive-routing setting left to the link layer.
const arAuto = -2

func readConfig(log nccl.Logger) (config, error) {
	c := config{
		disable:      nccl.EnvBool(log, "NCCL_IB_DISABLE", false),
		ibverbsLib:   nccl.EnvString("NCCL_IBVERBS_LIB", ibv.DefaultLibrary),
		pciOrder:     nccl.EnvBool(log, "NCCL_IB_DEVICE_PCI_ORDER", true),
		mergeVFs:     nccl.EnvBool(log, "NCCL_IB_MERGE_VFS", true),
		mergeNICs:    nccl.EnvBool(log, "NCCL_IB_MERGE_NICS", true),
		dmabuf:       nccl.EnvBool(log, "NCCL_DMABUF_ENABLE", true),
		relaxedOrder: int(nccl.EnvInt(log, "NCCL_IB_PCI_RELAXED_ORDERING", 2)),
		adaptive:     int(nccl.EnvInt(log, "NCCL_IB_ADAPTIVE_ROUTING", arAuto)),
		arThreshold:  int(nccl.EnvInt(log, "NCCL_IB_AR_THRESHOLD", 8192)),

		qpsPerConn:  int(nccl.EnvInt(log, "NCCL_IB_QPS_PER_CONNECTION", 1)),
		splitData:   nccl.EnvBool(log, "NCCL_IB_SPLIT_DATA_ON_QPS", false),
		pkey:        int(nccl.EnvInt(log, "NCCL_IB_PKEY", 0)),
		ackTimeout:  int(nccl.EnvInt(log, "NCCL_IB_TIMEOUT", 20)),
		retryCnt:    int(nccl.EnvInt(log, "NCCL_IB_RETRY_CNT", 7)),
		tc:          int(nccl.EnvInt(log, "NCCL_IB_TC", -1)),
		sl:          int(nccl.EnvInt(log, "NCCL_IB_SL", -1)),
		fifoTC:      int(nccl.EnvInt(log, "NCCL_IB_FIFO_TC", -1)),
		ece:         nccl.EnvBool(log, "NCCL_IB_ECE_ENABLE", true),
		useInline:   nccl.EnvBool(log, "NCCL_IB_USE_INLINE", false),
		returnAsync: nccl.EnvBool(log, "NCCL_IB_RETURN_ASYNC_EVENTS", true),
		forceFlush:  nccl.EnvBool(log, "NCCL_GO_IB_FORCE_FLUSH", false),
		noFlush:     nccl.EnvBool(log, "NCCL_GDR_FLUSH_DISABLE", false),

		magic:     uint64(nccl.EnvInt(log, "NCCL_SOCKET_MAGIC", defaultMagic)),
		dialRetry: int(nccl.EnvInt(log, "NCCL_SOCKET_RETRY_CNT", 34)),
		dialSleep: time.Duration(nccl.EnvInt(log, "NCCL_SOCKET_RETRY_SLEEP_MSEC", 100)) * time.Millisecond,
		peerTime:  nccl.PeerTimeout(log),
	}
	if c.qpsPerConn < 1 || c.qpsPerConn > maxQPs {
		n := min(max(c.qpsPerConn, 1), maxQPs)
		log.Warnf("NET/GoIB : NCCL_IB_QPS_PER_CONNECTION=%d outside [1,%d]; using %d", c.qpsPerConn, maxQPs, n)
		c.qpsPerConn = n
	}
	if c.adaptive != arAuto && c.adaptive != 0 && c.adaptive != 1 {
		log.Warnf("NET/GoIB : NCCL_IB_ADAPTIVE_ROUTING=%d is neither 0 nor 1; using the link layer's default (on for InfiniBand, off for RoCE)", c.adaptive)
		c.adaptive = arAuto
	}
	if c.arThreshold < 0 {
		log.Warnf("NET/GoIB : NCCL_IB_AR_THRESHOLD=%d is negative; using 8192", c.arThreshold)
		c.arThreshold = 8192
	}
	c.setupLimit = c.peerTime
	if c.peerTime <= 0 {
		// Dead-peer detection is off, but no call may wait forever.
		c.setupLimit = nccl.DefaultTimeout
		log.Warnf("NET/GoIB : %s=%v disables dead-peer detection: a peer host that vanishes silently leaves its comms waiting until NCCL's watchdog aborts them; connection set-up stays bounded by %v",
			nccl.EnvTimeout, c.peerTime, c.setupLimit)
	}
	if _, ok := nccl.LookupEnv("NCCL_GO_IB_CONNECT_TIMEOUT"); ok {
		log.Warnf("NET/GoIB : NCCL_GO_IB_CONNECT_TIMEOUT is no longer read: %s (now %v) bounds connection set-up like every other wait", nccl.EnvTimeout, c.setupLimit)
	}
	c.hca, c.hcaSpec = readHCAFilter(log)
	var err error
	c.gid, err = readGIDConfig(log)
	return c, err
}

// gidConfig holds the RoCE GID selection settings (NCCL >= 2.21 semantics).
type gidConfig struct {
	index       int // NCCL_IB_GID_INDEX; -1 = automatic
	family      int // 4 or 6, from NCCL_IB_ADDR_FAMILY (AF_INET default)
	addrRange   netip.Prefix
	hasRange    bool
	roceVersion int // NCCL_IB_ROCE_VERSION_NUM (2)
}

func readGIDConfig(log nccl.Logger) (gidConfig, error) {
	c := gidConfig{
		index:       int(nccl.EnvInt(log, "NCCL_IB_GID_INDEX", -1)),
		family:      4,
		roceVersion: int(nccl.EnvInt(log, "NCCL_IB_ROCE_VERSION_NUM", 2)),
	}
	switch f := strings.ToUpper(nccl.EnvString("NCCL_IB_ADDR_FAMILY", "AF_INET")); f {
	case "AF_INET", "INET", "IPV4":
	case "AF_INET6", "INET6", "IPV6":
		c.family = 6
	default:
		return c, nccl.Errorf(nccl.InvalidArgument, "NCCL_IB_ADDR_FAMILY=%s is neither AF_INET nor AF_INET6", f)
	}
	if r := nccl.EnvString("NCCL_IB_ADDR_RANGE", ""); r != "" {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			return c, nccl.Errorf(nccl.InvalidArgument, "NCCL_IB_ADDR_RANGE=%s is not a CIDR range (e.g. 10.0.0.0/8): %v", r, err)
		}
		c.addrRange, c.hasRange = p.Masked(), true
	}
	return c, nil
}

// trafficClass resolves the sender's tc and sl for a connection.
func (c *config) trafficClass(opts nccl.ConnectOptions) (tc, sl int) {
	tc, sl = c.tc, c.sl
	if tc < 0 {
		tc = max(opts.TrafficClass, 0)
	}
	if sl < 0 {
		sl = max(opts.TrafficClass, 0)
	}
	return tc, sl
}
