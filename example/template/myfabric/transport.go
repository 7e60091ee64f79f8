package myfabric

import (
	"fmt"
	"sync"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// logPrefix starts your log lines and error messages (NCCL prints them among
// its own, so say which plugin speaks).
const logPrefix = "NET/MyFabric"

// Transport is your fabric. The glue calls Init once on it, then
// Devices/Properties, then Listen/Connect from several NCCL threads at once,
// and Finalize when NCCL is done; a later start makes a new Transport.
type Transport struct {
	mu  sync.Mutex
	log nccl.Logger
	env nccl.Env // settings, WARNing with your prefix
	// TODO: discovered devices.
}

// New is the factory handed to nccl.Register.
func New() nccl.Transport { return &Transport{} }

// Name is used in logs; keep it equal to the name main registers the
// transport under, which NCCL_GO_TRANSPORT selects.
func (t *Transport) Name() string { return "myfabric" }

// Init discovers devices. Return an error wrapping nccl.ErrNoDevice when this
// host has no usable hardware, so the glue falls back quietly.
func (t *Transport) Init(ctx nccl.InitContext) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.log = ctx.Logger() // never nil
	t.env = nccl.Env{Log: t.log, Prefix: logPrefix}
	// TODO: probe the hardware; read settings with t.env.Int/String/Bool/
	// Duration at set-up time (never os.Getenv: NCCL sets some after the
	// library is loaded).
	if t.env.Bool("NCCL_MYFABRIC_DISABLE", false) {
		return fmt.Errorf("%w: NCCL_MYFABRIC_DISABLE=1", nccl.ErrNoDevice)
	}
	return nil
}

// Devices is the number of devices found by Init.
func (t *Transport) Devices() int { return 1 } // TODO

// Properties describes device dev; the glue converts it for every API version.
func (t *Transport) Properties(dev int) (nccl.Properties, error) {
	if dev != 0 {
		return nccl.Properties{}, nccl.Errorf(nccl.InvalidArgument, "%s : no device %d", logPrefix, dev)
	}
	return nccl.Properties{
		Name:       "myfabric0", // TODO: the NIC's name; NCCL's topology key
		PCIPath:    "",          // TODO: realpath of the NIC's sysfs PCI device; "" = virtual
		PtrSupport: nccl.PtrHost,
		Speed:      100000, // Mbps
		MaxComms:   65536,
		MaxRecvs:   1, // raise once Irecv handles grouped receives
		// RailID, PlaneID: leave unset unless the fabric has rails (nccl.KnownID).
	}, nil
}

var errTODO = nccl.Errorf(nccl.InternalError, "%s : not implemented yet (this is the transport template)", logPrefix)

// Listen must not block: write what the peer needs into handle and return.
func (t *Transport) Listen(dev int, handle *nccl.Handle) (nccl.Listener, error) {
	return nil, errTODO // TODO
}

// Connect must not block: return (nil, nil) until the connection is ready.
func (t *Transport) Connect(dev int, handle *nccl.Handle, opts nccl.ConnectOptions) (nccl.SendComm, error) {
	return nil, errTODO // TODO
}

// Finalize releases what Init acquired.
func (t *Transport) Finalize() error { return nil }
