package ncclenv

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/testhook"
)

type capture = testhook.Warnings

func withEnv(t *testing.T, env map[string]string) {
	t.Helper()
	SetLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	t.Cleanup(func() { SetLookup(nil) })
}

var testEnv = NewGroup("internal/ncclenv (test)", "NET/GoTest")

var (
	tInt   = testEnv.Int("NCCL_GO_TEST_INT", 16384, "an integer").In(0, 1<<20)
	tClamp = testEnv.Int("NCCL_GO_TEST_CLAMP", 1, "a clamped integer").Clamp(1, 128)
	tU64   = testEnv.Uint64("NCCL_GO_TEST_MAGIC", 0x564ab9f2fc4b9d6c, "a magic")
	tBool  = testEnv.Bool("NCCL_GO_TEST_BOOL", true, "a switch")
	tDur   = testEnv.Duration("NCCL_GO_TEST_DUR", 100*time.Millisecond, time.Millisecond, "a duration").In(0, time.Minute)
	tDurC  = testEnv.Duration("NCCL_GO_TEST_DURC", 15*time.Second, time.Second, "a clamped duration").Clamp(100*time.Millisecond, time.Hour)
	tFam   = testEnv.Family("NCCL_GO_TEST_FAMILY", AnyFamily, "a family")
	tList  = testEnv.List("NCCL_GO_TEST_LIST", MaxIfs, "a list")
	tStr   = testEnv.String("NCCL_GO_TEST_STR", "/dev/shm", "a string")
	tAuto  = testEnv.Int("NCCL_GO_TEST_AUTO", -2, "an integer with a sentinel default").ShowDefault("auto").In(-2, 64)
)

func TestIntVar(t *testing.T) {
	log := &capture{}
	for _, c := range []struct {
		val  string
		want int64
		warn string
	}{
		{"", 16384, ""},
		{"  ", 16384, ""}, // empty means unset
		{" 4096 ", 4096, ""},
		{"0x100", 256, ""},
		{"1048577", 16384, "NET/GoTest : ignoring NCCL_GO_TEST_INT=1048577: must be in [0, 1048576]; using 16384"},
		{"lots", 16384, `NET/GoTest : ignoring NCCL_GO_TEST_INT=lots: "lots" is not an integer (decimal, 0x hex or 0-prefixed octal); using the default 16384`},
		// nccl.conf keeps a trailing comment in the value; NCCL's strtoll stops
		// before it, and so do we, saying what was ignored.
		{"4096 # halved", 4096, `NET/GoTest : reading NCCL_GO_TEST_INT=4096 # halved as 4096: NCCL reads only the number at the start of "4096 # halved" and ignores " # halved"`},
	} {
		withEnv(t, map[string]string{"NCCL_GO_TEST_INT": c.val})
		assert.Equal(t, c.want, tInt.Get(log), c.val)
		got := log.Take()
		if c.warn == "" {
			assert.Empty(t, got, c.val)
		} else {
			assert.Equal(t, []string{c.warn}, got)
		}
	}
	// The number read still has to be in range.
	withEnv(t, map[string]string{"NCCL_GO_TEST_INT": "2000000 # too big"})
	assert.EqualValues(t, 16384, tInt.Get(log))
	got := log.Take()
	require.Len(t, got, 2)
	assert.Contains(t, got[0], "reading NCCL_GO_TEST_INT=2000000 # too big as 2000000")
	assert.Contains(t, got[1], "must be in [0, 1048576]; using 16384")
	withEnv(t, map[string]string{"NCCL_GO_TEST_CLAMP": "500"})
	assert.Equal(t, int64(128), tClamp.Get(log))
	assert.Equal(t, []string{"NET/GoTest : ignoring NCCL_GO_TEST_CLAMP=500: must be in [1, 128]; using 128"}, log.Take())
	assert.Equal(t, int64(1), tClamp.Default())
	// GetFor: the WARN carries the reader's prefix.
	withEnv(t, map[string]string{"NCCL_GO_TEST_INT": "x"})
	tInt.GetFor(log, "NET/GoIB")
	assert.True(t, strings.HasPrefix(log.Take()[0], "NET/GoIB : ignoring NCCL_GO_TEST_INT=x"))
	// A nil logger drops the WARN, the value is still the default.
	assert.Equal(t, int64(16384), tInt.Get(nil))
}

func TestOtherVars(t *testing.T) {
	log := &capture{}
	withEnv(t, map[string]string{
		"NCCL_GO_TEST_MAGIC": "0xffffffffffffffff", "NCCL_GO_TEST_BOOL": "off", "NCCL_GO_TEST_DUR": "250",
		"NCCL_GO_TEST_DURC": "10ms", "NCCL_GO_TEST_FAMILY": "AF_INET6", "NCCL_GO_TEST_STR": " /tmp/x ",
	})
	assert.Equal(t, ^uint64(0), tU64.Get(log))
	assert.False(t, tBool.Get(log))
	assert.Equal(t, 250*time.Millisecond, tDur.Get(log))
	assert.Equal(t, 100*time.Millisecond, tDurC.Get(log))
	assert.Equal(t, []string{"NET/GoTest : ignoring NCCL_GO_TEST_DURC=10ms: must be in [100ms, 1h0m0s]; using 100ms"}, log.Take())
	assert.Equal(t, IPv6, tFam.Get(log))
	assert.Equal(t, "/tmp/x", tStr.Get())
	assert.True(t, tStr.IsSet())

	withEnv(t, map[string]string{
		"NCCL_GO_TEST_MAGIC": "-1", "NCCL_GO_TEST_BOOL": "maybe", "NCCL_GO_TEST_DUR": "2h", "NCCL_GO_TEST_FAMILY": "ipv4",
	})
	assert.Equal(t, uint64(0x564ab9f2fc4b9d6c), tU64.Get(log))
	assert.True(t, tBool.Get(log))
	assert.Equal(t, 100*time.Millisecond, tDur.Get(log))
	assert.Equal(t, AnyFamily, tFam.Get(log))
	assert.Equal(t, "/dev/shm", tStr.Get())
	assert.False(t, tStr.IsSet())
	warns := log.Take()
	require.Len(t, warns, 4)
	assert.Contains(t, warns[0], "NCCL_GO_TEST_MAGIC=-1")
	assert.Contains(t, warns[0], "using the default 0x564ab9f2fc4b9d6c")
	assert.Contains(t, warns[1], "using the default 1")
	assert.Contains(t, warns[2], "must be in [0s, 1m0s]")
	assert.Contains(t, warns[3], "write AF_INET")
	assert.Contains(t, warns[3], "using the default any")
}

func TestListVar(t *testing.T) {
	log := &capture{}
	withEnv(t, nil)
	_, set := tList.Get(log)
	assert.False(t, set)
	withEnv(t, map[string]string{"NCCL_GO_TEST_LIST": "^=eth0:x"})
	l, set := tList.Get(log)
	assert.True(t, set)
	assert.Equal(t, List{Exclude: true, Exact: true, Entries: []Entry{{"eth0", 0, -1, -1}}}, l)
	assert.Equal(t, []string{`NET/GoTest : NCCL_GO_TEST_LIST=^=eth0:x: port "x" in entry "eth0:x" is not a decimal number; NCCL reads it as 0`}, log.Take())
}

func TestRegistry(t *testing.T) {
	s, ok := Find("NCCL_GO_TEST_INT")
	require.True(t, ok)
	assert.Equal(t, Setting{Name: "NCCL_GO_TEST_INT", Default: "16384", Doc: "an integer", Owner: "internal/ncclenv (test)", Kind: KindInt, Range: "[0, 1048576]"}, s)
	s, _ = Find("NCCL_GO_TEST_MAGIC")
	assert.Equal(t, "0x564ab9f2fc4b9d6c", s.Default)
	s, _ = Find("NCCL_GO_TEST_DURC")
	assert.Equal(t, "15s", s.Default)
	s, _ = Find("NCCL_GO_TEST_AUTO")
	assert.Equal(t, "auto", s.Default)
	assert.Equal(t, "[-2, 64]", s.Range)
	assert.Equal(t, int64(-2), tAuto.Default())
	s, _ = Find("NCCL_GO_TEST_BOOL")
	assert.Equal(t, "1", s.Default)
	assert.Equal(t, "NCCL_GO_TEST_INT", tInt.Name())
	assert.Equal(t, "NET/GoTest", testEnv.Prefix())

	all := All()
	for i := 1; i < len(all); i++ {
		assert.Less(t, all[i-1].Name, all[i].Name, "All is sorted")
	}
	withEnv(t, map[string]string{"NCCL_GO_TEST_INT": "7"})
	v, ok := tInt.Setting().Value()
	assert.True(t, ok)
	assert.Equal(t, "7", v)

	assert.Equal(t, []string{"NCCL_GO_TEST_INTT", "NCCL_GO_TYPO"},
		Undeclared([]string{"PATH=/bin", "NCCL_GO_TEST_INT=1", "NCCL_GO_TEST_INTT=2", "NCCL_DEBUG=INFO", "NCCL_GO_TYPO=1"}))
	assert.Equal(t, "NCCL_GO_TEST_INT", Suggest("NCCL_GO_TEST_INTT"))
	assert.Equal(t, "", Suggest("NCCL_GO_SOMETHING_ELSE_ENTIRELY"))
}

func TestRegistryReportsDuplicates(t *testing.T) {
	before := len(Duplicates())
	NewGroup("elsewhere", "").Int("NCCL_GO_TEST_INT", 1, "again")
	d := Duplicates()
	require.Len(t, d, before+1)
	assert.Equal(t, "NCCL_GO_TEST_INT (declared by internal/ncclenv (test) and by elsewhere)", d[before])
	s, _ := Find("NCCL_GO_TEST_INT")
	assert.Equal(t, "internal/ncclenv (test)", s.Owner, "the first declaration stays")
	registry.Lock()
	registry.dups = registry.dups[:before]
	registry.Unlock()
}

func TestLookupTrimsAndTreatsEmptyAsUnset(t *testing.T) {
	withEnv(t, map[string]string{"A": " x ", "B": "", "C": "  "})
	v, ok := Value("A")
	assert.True(t, ok)
	assert.Equal(t, "x", v)
	_, ok = Value("B")
	assert.False(t, ok)
	_, ok = Value("C")
	assert.False(t, ok)
	raw, ok := Lookup("A")
	assert.True(t, ok)
	assert.Equal(t, " x ", raw)
	SetLookup(nil)
	t.Setenv("NCCL_GO_TEST_OS", "1")
	v, ok = Value("NCCL_GO_TEST_OS")
	assert.True(t, ok && v == "1", "nil lookup reads the process environment")
}
