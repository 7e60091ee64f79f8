package nccl

import (
	"errors"
	"fmt"
)

// Result mirrors NCCL's ncclResult_t.
type Result int32

// Values of ncclResult_t.
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2 // network or OS failure
	InternalError      Result = 3 // misuse by NCCL core, or a plugin bug
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5 // user error (e.g. a send larger than the posted receive)
	RemoteError        Result = 6 // the peer or the fabric failed
	InProgress         Result = 7
	Timeout            Result = 8 // NCCL 2.30+; older NCCL treats unknown codes as errors
)

var resultNames = [...]string{"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError",
	"ncclInternalError", "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError",
	"ncclInProgress", "ncclTimeout"}

// String is NCCL's name for r ("ncclRemoteError"), as NCCL's logs print it.
func (r Result) String() string {
	if r >= 0 && int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("ncclResult(%d)", int32(r))
}

// Error is an error that knows which ncclResult_t it maps to. Transports return
// it so that the glue reports the right code; any other error maps to
// InternalError.
type Error struct {
	Code Result // what the glue returns to NCCL (ResultOf)
	Msg  string // what the glue's WARN prints
	Err  error  // optional cause, appended to Msg by Error()

	msgHasCause bool // built by Errorf with %w: Msg already spells out Err
}

// Error is Msg, followed by Err when Msg does not already spell it out.
func (e *Error) Error() string {
	if e.Err != nil && !e.msgHasCause {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

// Unwrap returns Err, so errors.Is and errors.As see the cause.
func (e *Error) Unwrap() error { return e.Err }

// Errorf builds an *Error with a formatted message. A %w verb wraps its
// operand; with several, Err joins them, so errors.Is and errors.As find each
// (ErrNoDevice among them).
func Errorf(code Result, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	var cause error
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		cause = u.Unwrap()
	case interface{ Unwrap() []error }:
		cause = errors.Join(u.Unwrap()...)
	}
	return &Error{Code: code, Msg: err.Error(), Err: cause, msgHasCause: cause != nil}
}

// ResultOf maps an error to the ncclResult_t the glue returns to NCCL. An
// error is never reported as a success: an *Error whose Code is Success (a
// literal without one) or InProgress (which NCCL's checks let through as
// success) maps to InternalError.
func ResultOf(err error) Result {
	if err == nil {
		return Success
	}
	var e *Error
	if errors.As(err, &e) {
		if e.Code == Success || e.Code == InProgress {
			return InternalError
		}
		return e.Code
	}
	var s sentinel
	if errors.As(err, &s) {
		return s.code()
	}
	return InternalError
}

// sentinel is the type of the package's error constants: a constant cannot be
// reassigned by another package, as an exported error variable could be.
type sentinel string

func (s sentinel) Error() string { return string(s) }

func (s sentinel) code() Result {
	switch s {
	case ErrNoDevice:
		return SystemError
	}
	return InternalError
}

// ErrNoDevice is returned by Transport.Init, usually wrapped with the reason
// (fmt.Errorf("%w: no port is ACTIVE", nccl.ErrNoDevice)), when the transport
// has nothing usable on this host (no RDMA port, no interface matching
// NCCL_SOCKET_IFNAME, ...). The glue then falls back to the next registered
// transport with an INFO line. It maps to ncclSystemError.
const ErrNoDevice sentinel = "no usable device"
