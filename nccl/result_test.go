package nccl

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestErrorfWrapsWithoutRepeatingTheCause(t *testing.T) {
	err := Errorf(SystemError, "connect to %s: %w", "10.0.0.1:5", io.EOF)
	assert.Equal(t, "connect to 10.0.0.1:5: EOF", err.Error())
	assert.True(t, errors.Is(err, io.EOF))
	assert.Equal(t, SystemError, ResultOf(err))
	lit := &Error{Code: RemoteError, Msg: "completion error", Err: io.ErrUnexpectedEOF}
	assert.Equal(t, "completion error: unexpected EOF", lit.Error())
}

func TestResultOf(t *testing.T) {
	assert.Equal(t, Success, ResultOf(nil))
	assert.Equal(t, InternalError, ResultOf(errors.New("plain")))
	assert.Equal(t, InvalidUsage, ResultOf(Errorf(InvalidUsage, "x")))
	assert.Equal(t, SystemError, ResultOf(ErrNoDevice))
	assert.Equal(t, "ncclRemoteError", RemoteError.String())
	assert.Equal(t, "ncclResult(42)", Result(42).String())
}

// A vendor's error must never reach NCCL as a success: a literal without a
// Code is Success, and NCCL's checks let InProgress through as one.
func TestErrorIsNeverReportedAsSuccess(t *testing.T) {
	assert.Equal(t, InternalError, ResultOf(&Error{Msg: "link down"}))
	assert.Equal(t, InternalError, ResultOf(Errorf(Success, "odd")))
	assert.Equal(t, InternalError, ResultOf(Errorf(InProgress, "odd")))
	assert.Equal(t, InternalError, ResultOf(fmt.Errorf("wrapped: %w", &Error{Msg: "link down"})))
}

// Several %w: each operand stays reachable, ErrNoDevice included (the glue's
// quiet fallback and nccltest's skip both ask errors.Is).
func TestErrorfWithSeveralWraps(t *testing.T) {
	err := Errorf(SystemError, "%w: %w", ErrNoDevice, io.EOF)
	assert.Equal(t, "no usable device: EOF", err.Error())
	assert.True(t, errors.Is(err, ErrNoDevice))
	assert.True(t, errors.Is(err, io.EOF))
	assert.Equal(t, SystemError, ResultOf(err))
}

func TestEnvParsing(t *testing.T) {
	env := map[string]string{"A": " 0x10 ", "B": "abc", "C": "yes", "D": "2.5", "E": "150ms"}
	SetEnvLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	defer SetEnvLookup(nil)
	e := Env{Log: &WriterLogger{W: io.Discard}, Prefix: "NET/Test"}
	assert.EqualValues(t, 16, e.Int("A", 1))
	assert.EqualValues(t, 7, e.Int("B", 7), "malformed value falls back to the default")
	assert.EqualValues(t, 3, e.Int("MISSING", 3))
	assert.True(t, e.Bool("C", false))
	assert.Equal(t, "2.5s", e.Duration("D", 0, 1e9).String())
	assert.Equal(t, "150ms", e.Duration("E", 0, 1e9).String())
}

func TestRegistryOrderAndDuplicates(t *testing.T) {
	Register("zz-late", 500, nil)
	Register("zz-early", -500, nil)
	t.Cleanup(func() { Unregister("zz-late"); Unregister("zz-early") })
	regs := Transports()
	assert.Equal(t, "zz-early", regs[0].Name)
	_, ok := Lookup("zz-late")
	assert.True(t, ok)
	assert.Panics(t, func() { Register("zz-late", 1, nil) })
	assert.Panics(t, func() { Register("ZZ-Late", 1, nil) }, "names differing only in case")
	r, ok := Lookup("ZZ-LATE")
	assert.True(t, ok, "NCCL_GO_TRANSPORT matches in any case, as NCCL_NET does")
	assert.Equal(t, "zz-late", r.Name)
	assert.True(t, Unregister("zz-late"))
	assert.False(t, Unregister("zz-late"), "already gone")
	_, ok = Lookup("zz-late")
	assert.False(t, ok)
}

// ErrNoDevice is a constant: this only compiles while it is one, so no package
// can reassign the sentinel every transport's Init wraps.
const _ = ErrNoDevice

func TestErrNoDeviceIsAnImmutableSentinel(t *testing.T) {
	wrapped := fmt.Errorf("%w: no RDMA port", ErrNoDevice)
	assert.True(t, errors.Is(wrapped, ErrNoDevice))
	assert.Equal(t, SystemError, ResultOf(wrapped))
	assert.False(t, errors.Is(errors.New("no usable device"), ErrNoDevice), "equal text is not the sentinel")
	assert.Equal(t, InternalError, ResultOf(sentinel("some other constant")))
}

func TestOptionalIDZeroValueIsUndefined(t *testing.T) {
	var p Properties
	_, ok := p.RailID.Get()
	assert.False(t, ok, "a transport that sets nothing reports no rail")
	id, ok := KnownID(0).Get()
	assert.True(t, ok)
	assert.Equal(t, 0, id, "0 is a valid rail")
	_, ok = KnownID(-1).Get()
	assert.False(t, ok)
	_, ok = KnownID(1 << 15).Get()
	assert.False(t, ok)
	assert.Equal(t, "7", KnownID(7).String())
}

func TestEnvUsesTheTransportPrefix(t *testing.T) {
	env := map[string]string{"X": "bogus", "B": "2"}
	SetEnvLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	defer SetEnvLookup(nil)
	var out strings.Builder
	e := Env{Log: &WriterLogger{W: &out}, Prefix: "NET/MyFabric"}
	assert.EqualValues(t, 3, e.Int("X", 3))
	assert.True(t, e.Bool("B", false), "NCCL treats any non-zero integer as on")
	assert.Equal(t, 2*time.Second, e.Duration("X", 2*time.Second, time.Second))
	assert.False(t, Env{}.Bool("X", false), "no logger: the default, quietly")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	assert.Len(t, lines, 2)
	for _, l := range lines {
		assert.True(t, strings.HasPrefix(l, "WARN NET/MyFabric : ignoring X=bogus"), l)
		assert.NotContains(t, l, "NET/Go ")
	}
}

func TestInitContextLoggerIsNeverNil(t *testing.T) {
	assert.Equal(t, DiscardLogger{}, InitContext{}.Logger())
	w := &WriterLogger{W: io.Discard}
	assert.Same(t, w, InitContext{Log: w}.Logger())
}

// What NCCL gets for a device whose transport filled nothing in: every
// default the Properties comments promise.
func TestPropertiesWithDefaults(t *testing.T) {
	p := Properties{}.WithDefaults("vendor", 3)
	assert.Equal(t, Properties{Name: "vendor3", PtrSupport: PtrHost, Speed: DefaultSpeed, MaxComms: 1, MaxRecvs: 1,
		VDevs: []int{3}, MaxP2PBytes: MaxNetSizeBytes, MaxCollBytes: MaxCollSize, MaxMultiRequestSize: 1}, p)
	q := Properties{Name: "x", MaxRecvs: 1000, MaxP2PBytes: 2 * MaxNetSizeBytes, Speed: 400000}.WithDefaults("vendor", 0)
	assert.Equal(t, MaxGroupedRecvs, q.MaxRecvs)
	assert.Equal(t, int64(MaxNetSizeBytes), q.MaxP2PBytes)
	assert.Equal(t, 400000, q.Speed)
	assert.Equal(t, "x", q.Name)
}
