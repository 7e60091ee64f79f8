package shm

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
	"github.com/libnccl-net-go/libnccl-net-go/internal/slots"
	"github.com/libnccl-net-go/libnccl-net-go/internal/timeout"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// proof is HMAC-SHA256(secret, label | nonce | pid). The file holds the nonce
// and both proofs but never the secret, so a process that can read the file
// (same uid) still cannot complete a connection it did not get the handle for.
func proof(secret []byte, label string, nonce []byte, pid uint64) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	m.Write(nonce)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], pid)
	m.Write(b[:])
	return m.Sum(nil)
}

// Listen implements nccl.Transport: it creates the connection file and never
// waits for anyone.
func (t *Transport) Listen(dev int, handle *nccl.Handle) (nccl.Listener, error) {
	if dev != 0 {
		return nil, nccl.Errorf(nccl.InvalidArgument, "%s : listen on device %d; shm has one device, 0", logPrefix, dev)
	}
	log := t.logger()
	t.mu.Lock()
	boot, ready := t.boot, t.ready
	t.mu.Unlock()
	if !ready {
		return nil, nccl.Errorf(nccl.InternalError, "%s : listen before init", logPrefix)
	}
	var rnd [secretLen + 32]byte // the secret, then the nonce
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "%s : no randomness for the connection secret: %v", logPrefix, err)
	}
	dir := settingDir.Get()
	ring := ringSizeSetting(log)
	var r *region
	swept := false
	for tries := 1; ; tries++ {
		var name [8]byte
		if _, err := rand.Read(name[:]); err != nil {
			return nil, nccl.Errorf(nccl.SystemError, "%s : no randomness for the connection file's name: %v", logPrefix, err)
		}
		path := filepath.Join(dir, fmt.Sprintf("%s%d-%x", connFilePrefix, os.Getpid(), name[:]))
		if len(path) > maxPathLen {
			return nil, nccl.Errorf(nccl.InvalidUsage, "%s : %s=%s is too long: connection paths must fit in %d bytes of the NCCL handle; use a shorter directory", logPrefix, envDir, dir, maxPathLen)
		}
		var err error
		r, err = createRegion(path, ring)
		switch {
		case err == nil:
		case errors.Is(err, errLostName) && tries < 3: // a sweep's race: another name
			continue
		case errors.Is(err, errLostName):
			return nil, nccl.Errorf(nccl.SystemError, "%s : cannot create a connection file in %s: %v, %d times", logPrefix, dir, err, tries)
		case errors.Is(err, unix.ENOSPC) && !swept:
			// Files that killed ranks left since Init may fill the directory.
			swept = true
			if sweep(dir, log) > 0 {
				continue
			}
			return nil, err
		default:
			return nil, err
		}
		break
	}
	h := r.h
	h.u32(offVersion).Store(layoutVersion)
	h.u32(offMaxRecvs).Store(maxRecvs)
	h.u64(offRingSize).Store(r.ringSize)
	copy(h.bytes(offNonce, 32), rnd[secretLen:])
	writeSide(h, sideRecv)
	h.u32(offState).Store(stListening)
	h.u64(offMagic).Store(fileMagic) // last: a connector trusts nothing before it
	secret := append([]byte(nil), rnd[:secretLen]...)
	encodeHandle(handle, boot, secret, r.path)
	return &listener{t: t, log: log, r: r, secret: secret, timeout: peerTimeout(log)}, nil
}

type listener struct {
	t        *Transport
	log      nccl.Logger
	r        *region
	secret   []byte
	timeout  time.Duration // NCCL_GO_TIMEOUT at listen
	claimAt  int64         // clock time a connector's claim was first seen; 0: none yet
	accepted bool
	warned   bool
}

// Accept implements nccl.Listener: one look at the state word. Waiting for a
// connector to show up is NCCL's business (as for every transport); once one
// claimed the file, the handshake is bounded: a connector that dies is an
// error at once, one that does not finish within NCCL_GO_TIMEOUT an error then.
func (l *listener) Accept() (nccl.RecvComm, error) {
	if l.accepted {
		return nil, nccl.Errorf(nccl.InternalError, "%s : accept called again after a connection was accepted (one connection per listen)", logPrefix)
	}
	if l.r == nil {
		return nil, nccl.Errorf(nccl.InternalError, "%s : accept on a closed listener", logPrefix)
	}
	h := l.r.h
	st := h.u32(offState).Load()
	switch st {
	case stListening, stRejected: // nobody yet, or a wrong proof the connector will withdraw
		l.claimAt = 0
		return nil, nil
	case stClaimed, stProved:
	default:
		return nil, nccl.Errorf(nccl.InternalError, "%s : %s is in unexpected state %d during accept", logPrefix, l.r.path, st)
	}
	pid := h.u64(h.side(sideSend, sidePid)).Load()
	if l.claimAt == 0 {
		l.claimAt = clock.Now()
	}
	w := newPeerWatch(l.r, sideSend, l.timeout)
	if err := w.check(); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "%s : the connecting process %d died during the handshake on %s: %v", logPrefix, pid, l.r.path, err)
	}
	if st == stClaimed {
		if bound := timeout.Bound(l.timeout); clock.Since(l.claimAt) > bound {
			return nil, nccl.Errorf(nccl.SystemError, "%s : process %d claimed %s but did not finish the handshake within %v (NCCL_GO_TIMEOUT); it is alive but stuck", logPrefix, pid, l.r.path, bound)
		}
		return nil, nil
	}
	nonce := h.bytes(offNonce, 32)
	if !hmac.Equal(proof(l.secret, "connect", nonce, pid), h.bytes(offConnProof, 32)) {
		if !l.warned {
			l.warned = true
			l.log.Warnf("%s : process %d tried to connect to %s with a wrong secret (a stale or corrupted handle); still waiting for the right peer", logPrefix, pid, l.r.path)
		}
		h.u32(offState).Store(stRejected)
		return nil, nil
	}
	copy(h.bytes(offAcceptProof, 32), proof(l.secret, "accept", nonce, pid))
	h.u32(offState).Store(stAccepted)
	l.r.unlink(l.log) // both ends have it mapped; nothing may outlive them
	rc := newRecvComm(l.r, l.log, l.timeout)
	l.r, l.accepted = nil, true
	return rc, nil
}

// Close implements nccl.Listener. After an accept the region belongs to the
// recv comm; before, a connector that already claimed it is told to give up.
func (l *listener) Close() error {
	if l.r == nil {
		return nil
	}
	l.r.h.u32(offState).Store(stListenerClosed)
	l.r.unlink(l.log)
	l.r.release()
	l.r = nil
	return nil
}

// pendingConnect is a connect NCCL is still polling.
type pendingConnect struct {
	r        *region
	secret   []byte
	w        peerWatch // the listener
	deadline int64     // clock time by which the listener must have accepted
	timeout  time.Duration
}

func (pc *pendingConnect) release() {
	if pc.r != nil {
		pc.r.release()
		pc.r = nil
	}
}

// Connect implements nccl.Transport. The first call maps the file, claims it
// and writes the proof; later calls (same handle buffer, which then holds the
// attempt's slots.Ref) look whether the listener accepted. None of them
// waits; a listener that dies fails the connect at once, one that does not
// accept within NCCL_GO_TIMEOUT fails it then.
func (t *Transport) Connect(dev int, handle *nccl.Handle, _ nccl.ConnectOptions) (nccl.SendComm, error) {
	if dev != 0 {
		return nil, nccl.Errorf(nccl.InvalidArgument, "%s : connect on device %d; shm has one device, 0", logPrefix, dev)
	}
	if binary.LittleEndian.Uint64(handle[0:]) == pendingMagic {
		id := binary.LittleEndian.Uint64(handle[8:])
		ref, ok := slots.Unpack(id)
		var pc *pendingConnect
		if ok {
			pc = t.pending.Get(ref)
		}
		if pc == nil {
			return nil, nccl.Errorf(nccl.InternalError, "%s : connect retried with attempt %#x, which failed or completed already", logPrefix, id)
		}
		return t.advance(ref, pc, handle)
	}
	boot, secret, path, err := decodeHandle(handle)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	myBoot, ready := t.boot, t.ready
	t.mu.Unlock()
	if !ready {
		return nil, nccl.Errorf(nccl.InternalError, "%s : connect before init", logPrefix)
	}
	if boot != ([16]byte{}) && myBoot != ([16]byte{}) && boot != myBoot {
		return nil, nccl.Errorf(nccl.SystemError, "%s : the listener of %s runs on another host; the shm transport only connects ranks of one host (use it for single-node jobs, or another NCCL_NET_PLUGIN)", logPrefix, path)
	}
	r, err := openRegion(path)
	if err != nil {
		return nil, err
	}
	// The lock comes before the claim, so that from the claim on the listener
	// can tell a live connector from a dead one; another process's lock means
	// another connector got here first (or a sweep is removing the file of a
	// listener that died).
	if err := r.lock(sideSend); err != nil {
		r.release()
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
			return nil, nccl.Errorf(nccl.InvalidUsage, "%s : %s already has a connector; NCCL connects once per listen handle", logPrefix, path)
		}
		return nil, nccl.Errorf(nccl.SystemError, "%s : cannot lock %s: %v", logPrefix, path, err)
	}
	h := r.h
	writeSide(h, sideSend)
	if !h.u32(offState).CompareAndSwap(stListening, stClaimed) {
		st := h.u32(offState).Load()
		r.release()
		if st == stListenerClosed {
			return nil, nccl.Errorf(nccl.SystemError, "%s : the listener of %s closed before this connect", logPrefix, path)
		}
		return nil, nccl.Errorf(nccl.InvalidUsage, "%s : %s already has a connector (state %d); NCCL connects once per listen handle", logPrefix, path, st)
	}
	pid := uint64(os.Getpid())
	copy(h.bytes(offConnProof, 32), proof(secret, "connect", h.bytes(offNonce, 32), pid))
	h.u32(offState).Store(stProved)

	log := t.logger()
	to := peerTimeout(log)
	pc := &pendingConnect{r: r, secret: secret, w: newPeerWatch(r, sideRecv, to), timeout: timeout.Bound(to)}
	pc.deadline = clock.Now() + int64(pc.timeout)
	ref, ok := t.pending.Add(pc)
	if !ok {
		pc.release()
		return nil, nccl.Errorf(nccl.InternalError, "%s : too many connects in progress (%d)", logPrefix, slots.MaxSlots)
	}
	*handle = nccl.Handle{} // the secret is not needed in this copy any more
	binary.LittleEndian.PutUint64(handle[0:], pendingMagic)
	binary.LittleEndian.PutUint64(handle[8:], ref.Pack())
	return t.advance(ref, pc, handle)
}

func (t *Transport) advance(ref slots.Ref, pc *pendingConnect, handle *nccl.Handle) (nccl.SendComm, error) {
	h := pc.r.h
	fail := func(err error) (nccl.SendComm, error) {
		t.pending.Remove(ref)
		pc.release()
		*handle = nccl.Handle{}
		return nil, err
	}
	switch st := h.u32(offState).Load(); st {
	case stAccepted:
		nonce := h.bytes(offNonce, 32)
		if !hmac.Equal(proof(pc.secret, "accept", nonce, h.u64(h.side(sideSend, sidePid)).Load()), h.bytes(offAcceptProof, 32)) {
			return fail(nccl.Errorf(nccl.SystemError, "%s : the listener of %s answered without knowing the handle's secret", logPrefix, pc.r.path))
		}
		t.pending.Remove(ref)
		sc := newSendComm(pc.r, pc.w, t.logger())
		pc.r = nil
		return sc, nil
	case stRejected:
		h.u32(offState).CompareAndSwap(stRejected, stListening) // let the right peer in
		return fail(nccl.Errorf(nccl.InvalidUsage, "%s : the listener of %s rejected this connect: the handle's secret does not match (a stale or corrupted handle)", logPrefix, pc.r.path))
	case stListenerClosed:
		return fail(nccl.Errorf(nccl.SystemError, "%s : the listener of %s closed before accepting", logPrefix, pc.r.path))
	case stProved:
		if err := pc.w.check(); err != nil {
			if pc.w.dead {
				// The listener was killed before it accepted or closed, so
				// nobody unlinked the file and nobody else will use it.
				pc.r.linked = true
				pc.r.unlink(t.logger())
			}
			return fail(err)
		}
		if clock.Now() > pc.deadline {
			return fail(nccl.Errorf(nccl.SystemError, "%s : the listener of %s (process %d) did not accept within %v (NCCL_GO_TIMEOUT); it is alive but its rank never accepted", logPrefix, pc.r.path, pc.w.pid, pc.timeout))
		}
		return nil, nil
	default:
		return fail(nccl.Errorf(nccl.InternalError, "%s : %s is in unexpected state %d during connect", logPrefix, pc.r.path, st))
	}
}
