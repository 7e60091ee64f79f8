package ib

import (
	"math"
	"net/netip"
	"strings"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	"github.com/libnccl-net-go/libnccl-net-go/internal/timeout"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// env declares every variable the transport reads; docs/configuration.md has
// a row for each (internal/settingsdoc checks). NCCL_SOCKET_IFNAME and
// NCCL_SOCKET_FAMILY (the out-of-band interface), NCCL_SOCKET_MAGIC and the
// connect retry settings are NCCL's socket settings, declared by
// internal/ncclsock; NCCL_GO_TIMEOUT by internal/timeout.
var env = ncclenv.NewGroup("ib", logPrefix)

var (
	envDisable      = env.Bool("NCCL_IB_DISABLE", false, "do not use the ib transport")
	envLib          = env.String("NCCL_IBVERBS_LIB", "", "libibverbs to dlopen before NCCL's defaults").ShowDefault("libibverbs.so, then libibverbs.so.1")
	envHCA          = env.List("NCCL_IB_HCA", ncclenv.MaxIBDevs, "HCA ports to use: <hca>[:<port>[:<rail>[:<plane>]]], comma-separated prefixes, '^' excludes, '=' exact names")
	envGIDIndex     = env.Int("NCCL_IB_GID_INDEX", -1, "RoCE GID index; -1 chooses automatically").ShowDefault("-1 (automatic)")
	envRoutableFLID = env.Int("NCCL_IB_ROUTABLE_FLID_GID_INDEX", 1,
		"InfiniBand: the GID index used when its FLID is not 0 (routing across subnets), else index 0")
	// NCCL compares the family exactly and reads anything else as AF_INET;
	// so does ib, with a WARN (readAddrFamily).
	envAddrFamily   = env.String("NCCL_IB_ADDR_FAMILY", "AF_INET", "address family of the automatically chosen RoCE GID")
	envAddrRange    = env.String("NCCL_IB_ADDR_RANGE", "", "CIDR range the automatically chosen RoCE GID must lie in").ShowDefault("unset (any)")
	envRoCEVersion  = env.Int("NCCL_IB_ROCE_VERSION_NUM", 2, "RoCE version of the automatically chosen GID")
	envPCIOrder     = env.Bool("NCCL_IB_DEVICE_PCI_ORDER", true, "number devices in PCI order")
	envMergeVFs     = env.Bool("NCCL_IB_MERGE_VFS", true, "treat the virtual functions of one NIC as one device")
	envMergeNICs    = env.Bool("NCCL_IB_MERGE_NICS", true, "fuse the ports of a dual-port NIC into one device")
	envDMABuf       = env.Bool("NCCL_DMABUF_ENABLE", true, "register GPU memory through dma-buf when the kernel supports it")
	envRelaxedOrder = env.Int("NCCL_IB_PCI_RELAXED_ORDERING", 2, "1 and 2 register with relaxed ordering when ibv_reg_mr_iova2 exists; any other value is off")
	envAdaptive     = env.Int("NCCL_IB_ADAPTIVE_ROUTING", arAuto, "0 or 1; unset follows the link layer (on for InfiniBand, off for RoCE)").ShowDefault("auto")
	envARThreshold  = env.Int("NCCL_IB_AR_THRESHOLD", 8192, "with adaptive routing, messages above this many bytes send their data apart from the immediate; -2 is unset (8192), other negatives: every message")
	envQPs          = env.Int("NCCL_IB_QPS_PER_CONNECTION", 1, "queue pairs per connection and device").Clamp(1, maxQPs)
	envSplitData    = env.Int("NCCL_IB_SPLIT_DATA_ON_QPS", 0, "1 spreads each message over every QP instead of one QP per message; any other value does not")
	envPKey         = env.Int("NCCL_IB_PKEY", 0, "partition key index")
	// The QP's timeout field has 5 bits and retry_cnt 3; NCCL passes any
	// value to ibv_modify_qp, where mlx5 keeps the low bits (NCCL_IB_TIMEOUT=40
	// would be 8: about 1 ms instead of a longer wait) and other providers
	// take or refuse it whole.
	envAckTimeout = env.Int("NCCL_IB_TIMEOUT", 20, "InfiniBand local ACK timeout exponent (4.096 us * 2^n; 0: none)").In(0, 31)
	envRetryCnt   = env.Int("NCCL_IB_RETRY_CNT", 7, "InfiniBand transport retry count").In(0, 7)
	envTC         = env.Int("NCCL_IB_TC", -1, "traffic class; -1 takes the communicator's").ShowDefault("-1 (the communicator's)")
	envSL         = env.Int("NCCL_IB_SL", -1, "service level; -1 takes the communicator's traffic class").ShowDefault("-1 (the communicator's)")
	envFIFOTC     = env.Int("NCCL_IB_FIFO_TC", -1, "traffic class of the clear-to-send writes; -1 takes the data's").ShowDefault("-1 (the data's)")
	envECE        = env.Bool("NCCL_IB_ECE_ENABLE", true, "negotiate enhanced connection establishment where the NIC supports it")
	envInline     = env.Bool("NCCL_IB_USE_INLINE", false, "send small clear-to-send entries inline")
	envAsync      = env.Bool("NCCL_IB_RETURN_ASYNC_EVENTS", true, "fail the comms of a device that reports a fatal async event")
	envQuerySpeed = env.Bool("NCCL_IB_QUERY_PORT_SPEED", true, "report a port's effective bandwidth from ibv_query_port_speed where libibverbs and the kernel have it (a LAG: the sum of its links); 0: always lane rate × width")
	envForceFlush = env.Bool("NCCL_GO_IB_FORCE_FLUSH", false, "flush host-memory receives too (testing)")
	envNoFlush    = env.Bool("NCCL_GDR_FLUSH_DISABLE", false, "skip the GPUDirect flush READ")
	// NCCL's wrap_ibv_modify_qp: a transition that fails with ETIMEDOUT (on
	// RoCE, RTR while the peer's address has no ARP answer yet) is tried
	// again after RETRY_SLEEP_MSEC × the attempt number.
	envMQPRetryAll   = env.Bool("NCCL_IB_MQP_RETRY_ALL", false, "retry a failed QP state transition whatever the error, not only ETIMEDOUT")
	envMQPRetryCnt   = env.Int("NCCL_IB_MQP_RETRY_CNT", 34, "retries of a QP state transition that failed with ETIMEDOUT").In(0, 1<<20)
	envMQPRetrySleep = env.Int("NCCL_IB_MQP_RETRY_SLEEP_MSEC", 100, "milliseconds before the first retry of a QP state transition; the n-th retry waits n times as long").In(0, 1<<20)
)

// logPrefix is what every ib line starts with.
const logPrefix = "NET/GoIB"

// config is every setting the transport reads. It is read once, by Init, as
// NCCL reads its NCCL_PARAMs once per process: a value changed afterwards
// does not change a running job, and no data-path call ever reads the
// environment. docs/ib.md lists each variable against what NCCL 2.30 does.
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
	relaxedOrder bool // NCCL_IB_PCI_RELAXED_ORDERING 1 or 2: on when ibv_reg_mr_iova2 exists
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
	querySpeed  bool // NCCL_IB_QUERY_PORT_SPEED
	forceFlush  bool // NCCL_GO_IB_FORCE_FLUSH (ours)
	noFlush     bool // NCCL_GDR_FLUSH_DISABLE
	mqpRetry    mqpRetry

	// Out-of-band handshake.
	magic      uint64        // NCCL_SOCKET_MAGIC
	dialRetry  int           // NCCL_SOCKET_RETRY_CNT
	dialSleep  time.Duration // NCCL_SOCKET_RETRY_SLEEP_MSEC
	peerTime   time.Duration // NCCL_GO_TIMEOUT: dead-peer detection (0: off)
	setupLimit time.Duration // bound on one connection set-up: NCCL_GO_TIMEOUT, or its default when that is off
}

// The adaptive-routing setting left to the link layer; for
// NCCL_IB_AR_THRESHOLD, NCCL's "not set".
const arAuto = -2

// readRelaxedOrdering is NCCL's ncclIbRelaxedOrderingCapable rule: only 1
// and 2 ask for relaxed ordering; any other value, 0 or not, is off.
func readRelaxedOrdering(log nccl.Logger) bool {
	v := envRelaxedOrder.Get(log)
	if v != 0 && v != 1 && v != 2 {
		log.Infof(nccl.SubsysInit|nccl.SubsysNet|nccl.SubsysEnv, "NET/GoIB : NCCL_IB_PCI_RELAXED_ORDERING=%d: off, as NCCL reads any value but 1 and 2; set 1 or 2 to register with relaxed ordering", v)
	}
	return v == 1 || v == 2
}

// readSplitData is NCCL's rule for NCCL_IB_SPLIT_DATA_ON_QPS: a message is
// spread over the QPs only when the value is exactly 1.
func readSplitData(log nccl.Logger) bool {
	v := envSplitData.Get(log)
	if v != 0 && v != 1 {
		log.Infof(nccl.SubsysInit|nccl.SubsysNet|nccl.SubsysEnv, "NET/GoIB : NCCL_IB_SPLIT_DATA_ON_QPS=%d: one QP per message, as NCCL splits only with 1", v)
	}
	return v == 1
}

func readConfig(log nccl.Logger) (config, error) {
	c := config{
		disable:      envDisable.Get(log),
		ibverbsLib:   envLib.Get(),
		pciOrder:     envPCIOrder.Get(log),
		mergeVFs:     envMergeVFs.Get(log),
		mergeNICs:    envMergeNICs.Get(log),
		dmabuf:       envDMABuf.Get(log),
		relaxedOrder: readRelaxedOrdering(log),
		adaptive:     int(envAdaptive.Get(log)),
		arThreshold:  int(envARThreshold.Get(log)),

		qpsPerConn:  int(envQPs.Get(log)),
		splitData:   readSplitData(log),
		pkey:        int(envPKey.Get(log)),
		ackTimeout:  int(envAckTimeout.Get(log)),
		retryCnt:    int(envRetryCnt.Get(log)),
		tc:          int(envTC.Get(log)),
		sl:          int(envSL.Get(log)),
		fifoTC:      int(envFIFOTC.Get(log)),
		ece:         envECE.Get(log),
		useInline:   envInline.Get(log),
		returnAsync: envAsync.Get(log),
		querySpeed:  envQuerySpeed.Get(log),
		forceFlush:  envForceFlush.Get(log),
		noFlush:     envNoFlush.Get(log),
		mqpRetry: mqpRetry{
			all:   envMQPRetryAll.Get(log),
			count: int(envMQPRetryCnt.Get(log)),
			sleep: time.Duration(envMQPRetrySleep.Get(log)) * time.Millisecond,
		},

		magic:    ncclsock.ReadMagic(log, logPrefix),
		peerTime: timeout.Read(log, logPrefix),
	}
	retry := ncclsock.ReadRetry(log, logPrefix)
	c.dialRetry, c.dialSleep = retry.Count, retry.Sleep
	if c.adaptive != arAuto && c.adaptive != 0 && c.adaptive != 1 {
		// NCCL keeps any value but -2 and tests it as a boolean.
		log.Infof(nccl.SubsysInit|nccl.SubsysNet|nccl.SubsysEnv, "NET/GoIB : NCCL_IB_ADAPTIVE_ROUTING=%d: on, as NCCL reads any value but 0 (and -2, the link layer's default)", c.adaptive)
		c.adaptive = 1
	}
	if c.arThreshold == arAuto {
		// NCCL's own default is -2, which it reads as "not set": 8192.
		c.arThreshold = int(envARThreshold.Default())
	} else if c.arThreshold < 0 {
		// NCCL compares the (signed) message size with it: every message,
		// zero-length ones included, is above a negative threshold.
		log.Infof(nccl.SubsysInit|nccl.SubsysNet|nccl.SubsysEnv, "NET/GoIB : NCCL_IB_AR_THRESHOLD=%d: with adaptive routing every message sends its data apart from the immediate, as in NCCL", c.arThreshold)
		c.arThreshold = -1
	}
	c.setupLimit = timeout.Bound(c.peerTime)
	if c.peerTime <= 0 {
		log.Warnf("NET/GoIB : %s=%v disables dead-peer detection: a peer host that vanishes silently leaves its comms waiting until NCCL's watchdog aborts them; connection set-up stays bounded by %v",
			timeout.Peer.Name(), c.peerTime, c.setupLimit)
	}
	if _, ok := ncclenv.Value("NCCL_GO_IB_CONNECT_TIMEOUT"); ok {
		log.Warnf("NET/GoIB : NCCL_GO_IB_CONNECT_TIMEOUT is no longer read: %s (now %v) bounds connection set-up like every other wait", timeout.Peer.Name(), c.setupLimit)
	}
	c.hca, c.hcaSpec = readHCAFilter(log)
	c.gid = readGIDConfig(log)
	return c, nil
}

// gidConfig holds the RoCE GID selection settings (NCCL >= 2.21 semantics).
type gidConfig struct {
	index       int // NCCL_IB_GID_INDEX; -1 = automatic
	family      int // 4 or 6, from NCCL_IB_ADDR_FAMILY (AF_INET default)
	addrRange   netip.Prefix
	hasRange    bool
	noMatch     bool // NCCL_IB_ADDR_RANGE with a negative mask: no GID is in range
	roceVersion int  // NCCL_IB_ROCE_VERSION_NUM (2)
	flidIndex   int  // NCCL_IB_ROUTABLE_FLID_GID_INDEX (1)
}

func readGIDConfig(log nccl.Logger) gidConfig {
	c := gidConfig{
		index:       int(envGIDIndex.Get(log)),
		family:      4,
		roceVersion: int(envRoCEVersion.Get(log)),
		flidIndex:   int(envRoutableFLID.Get(log)),
	}
	c.family = readAddrFamily(log, envAddrFamily.Get())
	if r := envAddrRange.Get(); r != "" {
		c.addrRange, c.hasRange, c.noMatch = readAddrRange(log, r, c.family)
	}
	return c
}

func init() {
	// ncclnet-go env reports what these readers WARN about, from the
	// readers themselves: their rules go beyond the declared grammar.
	ncclenv.SetCheck(envAddrFamily.Name(), ncclenv.FromReader(func(log ncclenv.Logger, raw string) {
		readAddrFamily(warnsOnly{log}, raw)
	}))
	// A mask with text after its number ("24x") is used, as strtol reads
	// it: read in part, not refused.
	ncclenv.SetCheck(envAddrRange.Name(), ncclenv.FromPartialReader(func(log ncclenv.Logger, raw string) (string, bool) {
		p, ok, _ := readAddrRange(warnsOnly{log}, raw, readAddrFamily(nccl.DiscardLogger{}, envAddrFamily.Get()))
		if !ok {
			return "", false
		}
		return p.String(), true
	}))
	ncclenv.SetCheck(envHCA.Name(), func(raw string) ncclenv.Verdict {
		if vd := envHCA.Check(raw); !vd.OK() {
			return vd
		}
		if w := emptyPortWarnings(raw); len(w) > 0 {
			return ncclenv.Verdict{Used: raw, Invalid: true, Why: w[0]}
		}
		return ncclenv.Verdict{Used: raw}
	})
}

// warnsOnly is a nccl.Logger that passes WARNs on and drops the rest.
type warnsOnly struct{ w ncclenv.Logger }

func (l warnsOnly) Warnf(format string, args ...any) { l.w.Warnf(format, args...) }
func (warnsOnly) Infof(nccl.Subsys, string, ...any)  {}
func (warnsOnly) Tracef(nccl.Subsys, string, ...any) {}

// readAddrRange reads NCCL_IB_ADDR_RANGE as NCCL's envIbAddrRange does,
// for the family NCCL_IB_ADDR_FAMILY chose. The range is ignored (any GID
// qualifies) when it has no '/', when the address is not one of that family
// (inet_pton: a range of the other family, a zone, a typo), or when the mask
// is larger than the family's. The mask is read as C's strtol reads it into
// an int: "abc" or "" is 0 (any address), "24x" is 24, and a negative mask
// matches no GID at all (noMatch), so automatic selection keeps index 0.
// NCCL logs the first two cases at INFO and the others not at all; ib WARNs
// about each, saying how NCCL reads the value, and never fails Init.
func readAddrRange(log nccl.Logger, r string, family int) (p netip.Prefix, ok, noMatch bool) {
	famName, bits := "AF_INET", 32
	if family == 6 {
		famName, bits = "AF_INET6", 128
	}
	s := r
	if len(s) > 127 { // NCCL copies it into a char[128]
		s = s[:127]
	}
	addrStr, maskStr, found := strings.Cut(s, "/")
	if !found {
		log.Warnf("NET/GoIB : ignoring NCCL_IB_ADDR_RANGE=%q: it has no \"/<mask>\", so NCCL ignores it, and so does ib; write it as <address>/<bits>, e.g. 10.0.0.0/8", r)
		return p, false, false
	}
	a, err := netip.ParseAddr(addrStr)
	switch {
	case err == nil && a.Zone() == "" && (family == 4) == a.Is4():
	case err == nil && a.Zone() == "" && family == 4:
		log.Warnf("NET/GoIB : ignoring NCCL_IB_ADDR_RANGE=%q: it is an IPv6 range but NCCL_IB_ADDR_FAMILY is AF_INET, so NCCL ignores it, and so does ib; set NCCL_IB_ADDR_FAMILY=AF_INET6 to select IPv6 GIDs, or give an IPv4 range", r)
		return p, false, false
	case err == nil && a.Zone() == "":
		log.Warnf("NET/GoIB : ignoring NCCL_IB_ADDR_RANGE=%q: it is an IPv4 range but NCCL_IB_ADDR_FAMILY is AF_INET6, so NCCL ignores it, and so does ib; unset NCCL_IB_ADDR_FAMILY to select IPv4 GIDs, or give an IPv6 range", r)
		return p, false, false
	default:
		log.Warnf("NET/GoIB : ignoring NCCL_IB_ADDR_RANGE=%q: %q is not an %s address (NCCL_IB_ADDR_FAMILY), so NCCL ignores the range, and so does ib; write it as <address>/<bits>, e.g. 10.0.0.0/8", r, addrStr, famName)
		return p, false, false
	}
	mask, clean := cStrtolInt(maskStr)
	switch {
	case mask > bits:
		log.Warnf("NET/GoIB : ignoring NCCL_IB_ADDR_RANGE=%q: mask %d is larger than %d, so NCCL ignores the range, and so does ib; write the mask as 0 to %d bits", r, mask, bits, bits)
		return p, false, false
	case mask < 0:
		log.Warnf("NET/GoIB : NCCL_IB_ADDR_RANGE=%q: NCCL reads the mask as %d, which matches no GID, so automatic selection keeps the port's GID index 0, and so does ib; write the mask as 0 to %d bits", r, mask, bits)
		return p, false, true
	case !clean:
		what := "so the range is " + netip.PrefixFrom(a, mask).Masked().String()
		if mask == 0 {
			what = "so the range matches any address"
		}
		log.Warnf("NET/GoIB : NCCL_IB_ADDR_RANGE=%q: NCCL reads the mask %q as %d (strtol), %s, and so does ib; write the mask in decimal bits", r, maskStr, mask, what)
	}
	return netip.PrefixFrom(a, mask).Masked(), true, false
}

// cStrtolInt reads s as (int)strtol(s, NULL, 10) does on LP64: leading
// white space, a sign, decimal digits up to the first other character (none:
// 0), saturated to 64 bits, then truncated to 32. clean says that s was
// a plain number with nothing after it, read as written.
func cStrtolInt(s string) (n int, clean bool) {
	i := 0
	for i < len(s) && strings.IndexByte(" \t\n\v\f\r", s[i]) >= 0 {
		i++
	}
	neg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	start := i
	var v uint64
	over := false
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		if v > (math.MaxUint64-9)/10 {
			over = true
		}
		v = v*10 + uint64(s[i]-'0')
	}
	var l int64
	switch {
	case !neg && (over || v > math.MaxInt64):
		l = math.MaxInt64
	case neg && (over || v > 1<<63):
		l = math.MinInt64
	case neg:
		l = -int64(v)
	default:
		l = int64(v)
	}
	return int(int32(l)), i > start && i == len(s) && int64(int32(l)) == l
}

// readAddrFamily reads NCCL_IB_ADDR_FAMILY as NCCL's envIbAddrFamily does:
// exactly "AF_INET6" is IPv6; exactly "AF_INET", empty or anything else is
// IPv4. NCCL says nothing about a value it does not take; ib WARNs, naming
// what to write, but goes on as NCCL does rather than failing Init (which
// would move the job to sockets over a spelling).
func readAddrFamily(log nccl.Logger, f string) int {
	if fam, err := ncclenv.ParseFamily(f); err == nil && fam == ncclenv.IPv6 {
		return 6
	} else if f == "" || err == nil {
		return 4
	}
	fix := "set NCCL_IB_ADDR_FAMILY=AF_INET6 for IPv6 GIDs, or unset it"
	switch strings.ToUpper(f) {
	case "AF_INET", "INET", "IPV4":
		fix = "set NCCL_IB_ADDR_FAMILY=AF_INET or unset it"
	case "AF_INET6", "INET6", "IPV6":
		fix = "set NCCL_IB_ADDR_FAMILY=AF_INET6 for IPv6 GIDs"
	}
	log.Warnf("NET/GoIB : NCCL_IB_ADDR_FAMILY=%q is neither AF_INET nor AF_INET6 (NCCL compares the exact name): NCCL reads it as AF_INET, and so does ib; %s", f, fix)
	return 4
}

// qos is a connection's traffic class and service level, and which setting
// each came from, so that a QP transition they break names that setting.
type qos struct {
	tc, sl         int
	tcFrom, slFrom string
}

// trafficClass resolves the sender's tc and sl for a connection.
func (c *config) trafficClass(opts nccl.ConnectOptions) qos {
	q := qos{tc: c.tc, sl: c.sl, tcFrom: "NCCL_IB_TC", slFrom: "NCCL_IB_SL"}
	from := "the communicator's traffic class"
	if opts.TrafficClass < 0 {
		from = "the default"
	}
	if q.tc < 0 {
		q.tc = max(opts.TrafficClass, 0)
		q.tcFrom = from + " (NCCL_IB_TC is unset)"
	}
	if q.sl < 0 {
		q.sl = max(opts.TrafficClass, 0)
		q.slFrom = from + " (NCCL_IB_SL is unset)"
	}
	return q
}

// receiverQoS is what the receiver uses: the sender's service level, and
// NCCL_IB_FIFO_TC or else the sender's traffic class for its CTS writes.
func (c *config) receiverQoS(m *connMeta) qos {
	q := qos{tc: c.fifoTC, sl: int(m.SL), tcFrom: "NCCL_IB_FIFO_TC",
		slFrom: "the sender's NCCL_IB_SL (or its communicator's traffic class when that is unset)"}
	if q.tc < 0 {
		q.tc = int(m.TC)
		q.tcFrom = "the sender's NCCL_IB_TC (or its communicator's traffic class when that is unset)"
	}
	return q
}
