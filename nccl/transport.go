package nccl

// Transport is a network fabric: device discovery and connection set-up. The glue
// makes one and calls Init once (however many communicators or API versions NCCL
// uses), and Finalize when the last user is gone. NCCL 2.28+ may start again
// after that in the same process: the glue then makes a new Transport and calls
// its Init, so no process-wide state may be torn down by Finalize in a way a
// second Init cannot rebuild.
//
// Threads: NCCL calls Devices, Properties and Listen/Connect from several
// threads at once (one service thread per communicator), so these must be safe
// for concurrent use.
type Transport interface {
	// Name is the transport's short name ("ib", "socket"), used in logs. It
	// should equal the name it is registered under, which is what
	// NCCL_GO_TRANSPORT selects (in any case).
	Name() string
	// Init discovers devices. Returning an error wrapping ErrNoDevice makes the
	// glue fall back to the next transport quietly (INFO); any other error is a
	// WARN. Init is never called again after a successful call unless Finalize ran.
	Init(ctx InitContext) error
	// Devices returns the number of devices, virtual devices included. It is > 0
	// after a successful Init.
	Devices() int
	// Properties describes device dev.
	Properties(dev int) (Properties, error)
	// Listen creates a listener on dev and writes everything the connector needs
	// into handle. It must not block.
	Listen(dev int, handle *Handle) (Listener, error)
	// Connect starts or continues connecting to the listener described by handle.
	// It must not block: while the connection is not ready it returns (nil, nil)
	// and NCCL calls it again with the same handle buffer, in which the transport
	// may keep its retry state (bytes the listener wrote are not needed again
	// once read).
	Connect(dev int, handle *Handle, opts ConnectOptions) (SendComm, error)
	// Finalize releases everything Init acquired.
	Finalize() error
}

// InitContext is what the glue hands a transport at Init.
type InitContext struct {
	Log Logger // writes through NCCL's logger; nil in a test's zero value (use Logger())
}

// Logger is Log, or a Logger that drops everything when there is none (a
// test's zero InitContext), so a transport never has to check for nil.
func (c InitContext) Logger() Logger {
	if c.Log == nil {
		return DiscardLogger{}
	}
	return c.Log
}

// VDeviceMaker is implemented by transports that can fuse several physical
// devices into one virtual NIC (NCCL's makeVDevice). It returns the new device's
// index; Devices grows by one.
type VDeviceMaker interface {
	MakeVDevice(devs []int) (int, error)
}

// Listener accepts the one connection NCCL expects per listen.
type Listener interface {
	// Accept returns (nil, nil) while no connection is ready. It must not block.
	Accept() (RecvComm, error)
	// Close releases the listener. NCCL calls it right after a successful Accept;
	// an accepted comm stays open.
	Close() error
}

// PeerAddresser is implemented by comms that know their peer's address; the glue
// names it in WARNs (stalled requests, failures) so users can find the other end.
type PeerAddresser interface {
	PeerAddr() string
}
