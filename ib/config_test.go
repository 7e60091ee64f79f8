package ib

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	"github.com/libnccl-net-go/libnccl-net-go/internal/timeout"
)

func TestConfigDefaults(t *testing.T) {
	setEnv(t)
	c, err := readConfig(&captureLog{})
	require.NoError(t, err)
	assert.Equal(t, 1, c.qpsPerConn)
	assert.Equal(t, arAuto, c.adaptive)
	assert.Equal(t, 8192, c.arThreshold)
	assert.Equal(t, uint64(ncclsock.DefaultMagic), c.magic)
	assert.Equal(t, 34, c.dialRetry)
	assert.Equal(t, 100*time.Millisecond, c.dialSleep)
	assert.Equal(t, timeout.Default, c.peerTime)
	assert.Equal(t, timeout.Default, c.setupLimit)
	assert.Equal(t, -1, c.gid.index)
	assert.Equal(t, 4, c.gid.family)
}

// NCCL reads NCCL_SOCKET_MAGIC with strtoull, as the socket transport does:
// a magic of 2^63 or more is a valid value, not a reason to fall back to the
// default (which would make ib disagree with socket and NCCL's bootstrap).
func TestConfigMagicIsUnsigned(t *testing.T) {
	setEnv(t, "NCCL_SOCKET_MAGIC", "0xfedcba9876543210")
	log := &captureLog{}
	c, err := readConfig(log)
	require.NoError(t, err)
	assert.Equal(t, uint64(0xfedcba9876543210), c.magic)
	assert.Zero(t, log.count("WARN"), log.String())
}

func TestConfigRangesWarn(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want func(config) int
		val  int
		warn string
	}{
		{[]string{"NCCL_IB_QPS_PER_CONNECTION", "0"}, func(c config) int { return c.qpsPerConn }, 1, "NET/GoIB : ignoring NCCL_IB_QPS_PER_CONNECTION=0: must be in [1, 128]; using 1"},
		{[]string{"NCCL_IB_QPS_PER_CONNECTION", "1000"}, func(c config) int { return c.qpsPerConn }, maxQPs, "using 128"},
		{[]string{"NCCL_IB_QPS_PER_CONNECTION", "4"}, func(c config) int { return c.qpsPerConn }, 4, ""},
		{[]string{"NCCL_IB_AR_THRESHOLD", "-5"}, func(c config) int { return c.arThreshold }, -1, ""},       // NCCL: every size is above a negative threshold
		{[]string{"NCCL_IB_AR_THRESHOLD", "-2"}, func(c config) int { return c.arThreshold }, 8192, ""},     // NCCL's "not set"
		{[]string{"NCCL_IB_SPLIT_DATA_ON_QPS", "2"}, func(c config) int { return b2i(c.splitData) }, 0, ""}, // NCCL splits only with 1
		{[]string{"NCCL_IB_SPLIT_DATA_ON_QPS", "1"}, func(c config) int { return b2i(c.splitData) }, 1, ""},
		{[]string{"NCCL_IB_PCI_RELAXED_ORDERING", "3"}, func(c config) int { return b2i(c.relaxedOrder) }, 0, ""}, // NCCL: only 1 and 2
		{[]string{"NCCL_IB_PCI_RELAXED_ORDERING", "1"}, func(c config) int { return b2i(c.relaxedOrder) }, 1, ""},
		{[]string{"NCCL_IB_ADAPTIVE_ROUTING", "3"}, func(c config) int { return c.adaptive }, 1, ""}, // NCCL: any value but 0 and -2 is on
		{[]string{"NCCL_IB_TIMEOUT", "twenty"}, func(c config) int { return c.ackTimeout }, 20, "NET/GoIB : ignoring NCCL_IB_TIMEOUT=twenty"},
		{[]string{"NCCL_IB_TIMEOUT", "40"}, func(c config) int { return c.ackTimeout }, 20, "NET/GoIB : ignoring NCCL_IB_TIMEOUT=40: must be in [0, 31]; using 20"},
		{[]string{"NCCL_IB_TIMEOUT", "-1"}, func(c config) int { return c.ackTimeout }, 20, "must be in [0, 31]"},
		{[]string{"NCCL_IB_TIMEOUT", "31"}, func(c config) int { return c.ackTimeout }, 31, ""},
		{[]string{"NCCL_IB_RETRY_CNT", "10"}, func(c config) int { return c.retryCnt }, 7, "NET/GoIB : ignoring NCCL_IB_RETRY_CNT=10: must be in [0, 7]; using 7"},
		{[]string{"NCCL_IB_RETRY_CNT", "0"}, func(c config) int { return c.retryCnt }, 0, ""},
		{[]string{"NCCL_SOCKET_RETRY_CNT", "5"}, func(c config) int { return c.dialRetry }, 5, ""},
	} {
		setEnv(t, tc.env...)
		log := &captureLog{}
		c, err := readConfig(log)
		require.NoError(t, err)
		assert.Equal(t, tc.val, tc.want(c), "%v", tc.env)
		if tc.warn == "" {
			assert.Zero(t, log.count("WARN"), log.String())
		} else {
			assert.True(t, log.has(tc.warn), "%v: %s", tc.env, log.String())
		}
	}
}

func TestConfigTimeout(t *testing.T) {
	setEnv(t, "NCCL_GO_TIMEOUT", "0", "NCCL_GO_IB_CONNECT_TIMEOUT", "9")
	log := &captureLog{}
	c, err := readConfig(log)
	require.NoError(t, err)
	assert.Zero(t, c.peerTime)
	assert.Equal(t, timeout.Default, c.setupLimit, "set-up stays bounded")
	assert.True(t, log.has("NCCL_GO_TIMEOUT=0s disables dead-peer detection"), log.String())
	assert.True(t, log.has("NCCL_GO_IB_CONNECT_TIMEOUT is no longer read"), log.String())
}

// Every variable ib reads is declared once, by the ib group, except the
// socket and timeout settings it shares.
func TestConfigDeclared(t *testing.T) {
	for _, name := range []string{"NCCL_IB_HCA", "NCCL_IB_QPS_PER_CONNECTION", "NCCL_IB_ADDR_FAMILY", "NCCL_GDR_FLUSH_DISABLE", "NCCL_GO_IB_FORCE_FLUSH"} {
		s, ok := ncclenv.Find(name)
		require.True(t, ok, name)
		assert.Equal(t, "ib", s.Owner, name)
	}
	s, ok := ncclenv.Find("NCCL_SOCKET_MAGIC")
	require.True(t, ok)
	assert.NotEqual(t, "ib", s.Owner)
}

// NCCL's envIbAddrFamily compares NCCL_IB_ADDR_FAMILY with strcmp against
// "AF_INET" and "AF_INET6"; anything else silently means AF_INET. ib reads it
// the same way, WARNs about the value NCCL does not take, and never fails
// Init over it (which would drop the job to sockets).
func TestConfigAddrFamilyExact(t *testing.T) {
	for _, tc := range []struct {
		val    string
		family int
		warn   string
	}{
		{"AF_INET", 4, ""},
		{"AF_INET6", 6, ""},
		{"af_inet6", 4, `NET/GoIB : NCCL_IB_ADDR_FAMILY="af_inet6" is neither AF_INET nor AF_INET6 (NCCL compares the exact name): NCCL reads it as AF_INET, and so does ib; set NCCL_IB_ADDR_FAMILY=AF_INET6 for IPv6 GIDs`},
		{"IPV6", 4, "set NCCL_IB_ADDR_FAMILY=AF_INET6 for IPv6 GIDs"},
		{"inet", 4, "set NCCL_IB_ADDR_FAMILY=AF_INET or unset it"},
		{"bogus", 4, `NCCL_IB_ADDR_FAMILY="bogus" is neither AF_INET nor AF_INET6`},
	} {
		setEnv(t, "NCCL_IB_ADDR_FAMILY", tc.val)
		log := &captureLog{}
		c, err := readConfig(log)
		require.NoError(t, err, tc.val)
		assert.Equal(t, tc.family, c.gid.family, tc.val)
		if tc.warn == "" {
			assert.Zero(t, log.count("WARN"), log.String())
		} else {
			assert.True(t, log.has(tc.warn), "%s: %s", tc.val, log.String())
		}
	}
}

// NCCL's envIbAddrRange ignores NCCL_IB_ADDR_RANGE (with an INFO, or
// silently) when it has no '/', when the address does not parse for
// NCCL_IB_ADDR_FAMILY (so a range of the other family is ignored), or when
// the mask is larger than the family's; the mask is read with strtol, so
// "/abc" is 0 (any address) and "/24x" is 24. ib reads it the same way,
// WARNs about each, and never fails Init over it.
func TestConfigAddrRangeAsNCCL(t *testing.T) {
	v4 := func(s string) verbs.GID {
		return verbs.GID(netip.AddrFrom16(netip.MustParseAddr(s).As16()).As16())
	}
	v6 := func(s string) verbs.GID { return verbs.GID(netip.MustParseAddr(s).As16()) }
	for _, tc := range []struct {
		family, val string
		want        string // the range used; "" ignored, "none" matches no GID
		warn        string
	}{
		{"", "10.0.0.0/8", "10.0.0.0/8", ""},
		{"", "10.1.2.3/8", "10.0.0.0/8", ""},
		{"", "10.0.0.0/ 8", "10.0.0.0/8", ""},
		{"AF_INET6", "2001:db8::/32", "2001:db8::/32", ""},
		{"", "10.0.0.0/0", "0.0.0.0/0", ""},
		{"", "10.0.0.0", "", `NET/GoIB : ignoring NCCL_IB_ADDR_RANGE="10.0.0.0": it has no "/<mask>", so NCCL ignores it, and so does ib; write it as <address>/<bits>, e.g. 10.0.0.0/8`},
		{"", "10.0.0/8", "", `ignoring NCCL_IB_ADDR_RANGE="10.0.0/8": "10.0.0" is not an AF_INET address (NCCL_IB_ADDR_FAMILY), so NCCL ignores the range, and so does ib`},
		{"", "2001:db8::/32", "", `ignoring NCCL_IB_ADDR_RANGE="2001:db8::/32": it is an IPv6 range but NCCL_IB_ADDR_FAMILY is AF_INET, so NCCL ignores it, and so does ib; set NCCL_IB_ADDR_FAMILY=AF_INET6 to select IPv6 GIDs, or give an IPv4 range`},
		{"AF_INET6", "10.0.0.0/8", "", `it is an IPv4 range but NCCL_IB_ADDR_FAMILY is AF_INET6`},
		{"AF_INET6", "fe80::1%eth0/64", "", `"fe80::1%eth0" is not an AF_INET6 address`},
		{"", "10.0.0.0/33", "", `ignoring NCCL_IB_ADDR_RANGE="10.0.0.0/33": mask 33 is larger than 32, so NCCL ignores the range, and so does ib`},
		{"AF_INET6", "2001:db8::/129", "", `mask 129 is larger than 128`},
		{"", "10.0.0.0/abc", "0.0.0.0/0", `NET/GoIB : NCCL_IB_ADDR_RANGE="10.0.0.0/abc": NCCL reads the mask "abc" as 0 (strtol), so the range matches any address, and so does ib; write the mask in decimal bits`},
		{"", "10.0.0.0/", "0.0.0.0/0", `NCCL reads the mask "" as 0`},
		{"", "10.0.0.0/24x", "10.0.0.0/24", `NCCL reads the mask "24x" as 24`},
		{"", "10.0.0.0/4294967304", "10.0.0.0/8", `NCCL reads the mask "4294967304" as 8`},
		{"", "10.0.0.0/-1", "none", `NCCL_IB_ADDR_RANGE="10.0.0.0/-1": NCCL reads the mask as -1, which matches no GID, so automatic selection keeps the port's GID index 0, and so does ib; write the mask as 0 to 32 bits`},
	} {
		setEnv(t, "NCCL_IB_ADDR_FAMILY", tc.family, "NCCL_IB_ADDR_RANGE", tc.val)
		log := &captureLog{}
		c, err := readConfig(log)
		require.NoError(t, err, tc.val)
		switch tc.want {
		case "":
			assert.False(t, c.gid.hasRange, tc.val)
			assert.True(t, c.gid.inRange(v4("192.0.2.1")) && c.gid.inRange(v6("2001:db9::1")), tc.val)
		case "none":
			assert.False(t, c.gid.inRange(v4("10.0.0.1")) || c.gid.inRange(v6("2001:db8::1")), tc.val)
		default:
			assert.True(t, c.gid.hasRange, tc.val)
			assert.Equal(t, tc.want, c.gid.addrRange.String(), tc.val)
		}
		if tc.warn == "" {
			assert.Zero(t, log.count("WARN"), "%s: %s", tc.val, log.String())
		} else {
			assert.True(t, log.has(tc.warn), "%s: %s", tc.val, log.String())
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
