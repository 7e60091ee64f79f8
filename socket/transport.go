package socket

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Transport is the TCP transport. The zero value is not usable; call New.
type Transport struct {
	// Test hooks, fixed before Init: where interfaces and sysfs come from.
	ifaces  IfaceSource
	sysRoot string

	mu        sync.Mutex
	log       nccl.Logger
	ready     bool
	devs      []device
	pending   map[uint64]*connectOp
	listeners map[*listener]struct{}
	// drain holds closed send comms' streams until their bytes are
	// acknowledged (drain.go).
	drain drainer
}

// New returns an uninitialised socket transport, for nccl.Register.
func New() nccl.Transport { return &Transport{ifaces: hostIfaces{}, sysRoot: "/sys"} }

// Name implements nccl.Transport.
func (t *Transport) Name() string { return "socket" }

// Init implements nccl.Transport: it finds the interfaces NCCL's rules select.
func (t *Transport) Init(ctx nccl.InitContext) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ready {
		return nil
	}
	t.log = ctx.Log
	if t.log == nil {
		t.log = nccl.DiscardLogger{}
	}
	ifs, err := t.ifaces.Interfaces()
	if err != nil {
		return nccl.Errorf(nccl.SystemError, "NET/GoSocket : listing network interfaces: %w", err)
	}
	devs, how := findDevices(ifs, t.log)
	if len(devs) == 0 {
		if v, ok := ncclenv.Value(envIfname); ok && len(v) > 1 {
			// Say which selected interfaces were unusable and why: "dn0
			// is down" tells more than "none is up".
			why := ""
			if u := ncclsock.Unusable(ifs); len(u) > 0 {
				why = ": " + strings.Join(u, ", ")
			}
			t.log.Warnf("NET/GoSocket : no interface matches %s=%s (or none is up and running with an address%s%s); "+
				"set %s to an interface of this host (see `ip addr`)", envIfname, v, familyHint(t.log), why, envIfname)
		} else {
			t.log.Warnf("NET/GoSocket : no usable network interface found (none is up and running with an address%s); "+
				"set %s to the interface to use", familyHint(t.log), envIfname)
		}
		return fmt.Errorf("%w: socket transport: no interface matches %s", nccl.ErrNoDevice, how)
	}
	sys := sysfs{root: t.sysRoot}
	names := make([]string, len(devs))
	for i := range devs {
		d := &devs[i]
		d.props = nccl.Properties{
			Name:         d.name,
			PCIPath:      sys.pciPath(d.name),
			GUID:         uint64(i),
			PtrSupport:   nccl.PtrHost,
			Speed:        sys.speed(d.name),
			MaxComms:     65536,
			MaxRecvs:     maxRecvs,
			MaxP2PBytes:  nccl.MaxNetSizeBytes,
			MaxCollBytes: nccl.MaxCollSize,
		}
		names[i] = fmt.Sprintf("[%d]%s", i, d)
	}
	t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoSocket : using %s (%s)", strings.Join(names, " "), how)
	// The host's source rules only matter where two devices share a subnet;
	// without them (no netlink), such a pair gets the WARN.
	rules, _ := sourceRules.Get()()
	if shared := sharedSubnets(devs, rules); len(shared) > 0 {
		t.log.Warnf("NET/GoSocket : devices on the same subnet: %s; the kernel sends a subnet's traffic through one "+
			"interface, so NCCL's choice of NIC per GPU is lost unless each address is routed out of its own NIC "+
			"(ip rule add from <addr> table <n>); give each NIC its own subnet, add those rules, or select one with %s",
			strings.Join(shared, "; "), envIfname)
	}
	if peerTimeout(t.log) <= 0 {
		t.log.Warnf("NET/GoSocket : %s <= 0: a peer whose host vanishes (power loss, cut link) is never detected; "+
			"its requests stay pending until NCCL's watchdog; closed or killed peers are still seen", envTimeout)
	}
	t.devs = devs
	t.drain.reopen()
	t.pending = map[uint64]*connectOp{}
	t.listeners = map[*listener]struct{}{}
	t.ready = true
	return nil
}

func familyHint(log nccl.Logger) string {
	switch family(log) {
	case 4:
		return " of family AF_INET (" + envFamily + ")"
	case 6:
		return " of family AF_INET6 (" + envFamily + ")"
	}
	return ""
}

// Devices implements nccl.Transport.
func (t *Transport) Devices() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.devs)
}

func (t *Transport) device(dev int) (*device, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.ready {
		return nil, nccl.Errorf(nccl.InternalError, "socket transport used before Init")
	}
	if dev < 0 || dev >= len(t.devs) {
		return nil, nccl.Errorf(nccl.InvalidArgument, "socket transport has no device %d (it has %d)", dev, len(t.devs))
	}
	return &t.devs[dev], nil
}

// Properties implements nccl.Transport.
func (t *Transport) Properties(dev int) (nccl.Properties, error) {
	d, err := t.device(dev)
	if err != nil {
		return nccl.Properties{}, err
	}
	return d.props, nil
}

// Listen implements nccl.Transport: it binds an ephemeral port on the device's
// address; Accept calls take connections from its backlog.
func (t *Transport) Listen(dev int, h *nccl.Handle) (nccl.Listener, error) {
	d, err := t.device(dev)
	if err != nil {
		return nil, err
	}
	t.sweepPending(clock.Now())
	return t.listen(d, h)
}

// Connect implements nccl.Transport. The first call starts a connect and
// records its id in the caller's handle copy (NCCL passes the same buffer on
// every retry); every call advances it without blocking (connect.go).
func (t *Transport) Connect(dev int, h *nccl.Handle, _ nccl.ConnectOptions) (nccl.SendComm, error) {
	d, err := t.device(dev)
	if err != nil {
		return nil, err
	}
	var op *connectOp
	if id, ok := pendingConn(h); ok {
		t.mu.Lock()
		op = t.pending[id]
		t.mu.Unlock()
		if op == nil {
			return nil, nccl.Errorf(nccl.InternalError, "connect retry with an unknown pending connection %#x (handle reused after it completed?)", id)
		}
	} else {
		hi, err := decodeHandle(h, magic(t.log))
		if err != nil {
			t.log.Warnf("NET/GoSocket : connect: %v", err)
			return nil, err
		}
		var idb [8]byte
		if _, err := rand.Read(idb[:]); err != nil {
			return nil, nccl.Errorf(nccl.SystemError, "reading random bytes: %w", err)
		}
		t.sweepPending(clock.Now())
		op = newConnectOp(binary.LittleEndian.Uint64(idb[:])|1, hi, d, t.log)
		op.drain = &t.drain
		t.mu.Lock()
		if !t.ready {
			t.mu.Unlock()
			return nil, nccl.Errorf(nccl.InternalError, "socket transport finalized")
		}
		t.pending[op.id] = op
		t.mu.Unlock()
		setPendingConn(h, op.id)
	}
	sc, err, done := op.poll()
	if !done {
		return nil, nil
	}
	t.mu.Lock()
	delete(t.pending, op.id)
	t.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return sc, nil
}

// sweepPending ends the connects NCCL stopped calling. A connect that NCCL
// still polls ends by itself at its deadline (connect.go); one still open
// after it was abandoned: ncclCommAbort during connection set-up leaves it,
// and NCCL never calls connect with its handle again. Its sockets would stay
// open until Finalize, which another communicator may keep from coming, and
// the listener's end of them would keep waiting. New connects and listens
// (the set-up calls every later communicator makes) sweep those not called
// for a whole NCCL_GO_TIMEOUT; a late call with a swept connect's handle gets
// its error, until it has not been called for twice the bound.
func (t *Transport) sweepPending(now int64) {
	t.mu.Lock()
	var stale []*connectOp
	for _, op := range t.pending {
		if now >= op.deadline {
			stale = append(stale, op)
		}
	}
	t.mu.Unlock()
	for _, op := range stale {
		if op.expire(now) {
			t.mu.Lock()
			if t.pending[op.id] == op {
				delete(t.pending, op.id)
			}
			t.mu.Unlock()
		}
	}
}

// Finalize implements nccl.Transport: it ends pending connects, closes
// listeners and the connections nobody claimed, and stops the drainer
// (drain.go), the only thing of the transport's that runs in the background.
func (t *Transport) Finalize() error {
	t.mu.Lock()
	if !t.ready {
		t.mu.Unlock()
		return nil
	}
	t.ready = false
	ops := make([]*connectOp, 0, len(t.pending))
	for id, op := range t.pending {
		ops = append(ops, op)
		delete(t.pending, id)
	}
	ls := make([]*listener, 0, len(t.listeners))
	for l := range t.listeners {
		ls = append(ls, l)
	}
	t.devs = nil
	t.mu.Unlock()
	for _, op := range ops {
		op.abort()
	}
	for _, l := range ls {
		l.Close()
	}
	t.drain.closeAll(t.log)
	return nil
}

// dialAddr is where to connect: a link-local listener address is only
// meaningful on our own device's link, so it takes our interface as zone.
func dialAddr(hi handleInfo, d *device) string {
	a := hi.addr.Addr()
	if a.Is6() && (a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast()) {
		a = a.WithZone(d.name)
	}
	return net.JoinHostPort(a.String(), fmt.Sprint(hi.addr.Port()))
}
