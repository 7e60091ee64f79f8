package nccl

import (
	"errors"
	"io"
	"testing"

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

func TestEnvParsing(t *testing.T) {
	env := map[string]string{"A": " 0x10 ", "B": "abc", "C": "yes", "D": "2.5", "E": "150ms"}
	SetEnvLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	defer SetEnvLookup(nil)
	l := &WriterLogger{W: io.Discard}
	assert.EqualValues(t, 16, EnvInt(l, "A", 1))
	assert.EqualValues(t, 7, EnvInt(l, "B", 7), "malformed value falls back to the default")
	assert.EqualValues(t, 3, EnvInt(l, "MISSING", 3))
	assert.True(t, EnvBool(l, "C", false))
	assert.Equal(t, "2.5s", EnvDuration(l, "D", 0, 1e9).String())
	assert.Equal(t, "150ms", EnvDuration(l, "E", 0, 1e9).String())
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
	assert.True(t, Unregister("zz-late"))
	assert.False(t, Unregister("zz-late"), "already gone")
	_, ok = Lookup("zz-late")
	assert.False(t, ok)
}
