package shm

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"

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
		return nil, nccl.Errorf(nccl.InvalidArgument, "NET/Shm : listen on device %d; shm has one device, 0", dev)
	}
	log := t.logger()
	t.mu.Lock()
	boot, ready := t.boot, t.ready
	t.mu.Unlock()
	if !ready {
		return nil, nccl.Errorf(nccl.InternalError, "NET/Shm : listen before init")
	}
	var rnd [8 + secretLen + 32]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/Shm : no randomness for the connection secret: %v", err)
	}
	dir := nccl.EnvString(envDir, defaultDir)
	path := fmt.Sprintf("%s/ncclgo-shm-%d-%x", dir, os.Getpid(), rnd[:8])
	if len(path) > maxPathLen {
		return nil, nccl.Errorf(nccl.InvalidUsage, "NET/Shm : %s=%s is too long: connection paths must fit in %d bytes of the NCCL handle; use a shorter directory", envDir, dir, maxPathLen)
	}
	r, err := createRegion(path, ringSizeSetting(log))
	if err != nil {
		return nil, err
	}
	h := r.h
	h.u32(offVersion).Store(layoutVersion)
	h.u32(offMaxRecvs).Store(maxRecvs)
	h.u64(offRingSize).Store(r.ringSize)
	copy(h.bytes(offNonce, 32), rnd[8+secretLen:])
	h.u64(h.side(sideRecv, sidePid)).Store(uint64(os.Getpid()))
	h.u64(h.side(sideRecv, sidePidNS)).Store(pidNS())
	h.u32(offState).Store(stListening)
	h.u64(offMagic).Store(fileMagic) // last: a connector trusts nothing before it
	startBeating(r, sideRecv)
	secret := append([]byte(nil), rnd[8:8+secretLen]...)
	encodeHandle(handle, boot, secret, path)
	return &listener{t: t, log: log, r: r, secret: secret}, nil
}

type listener struct {
	t        *Transport
	log      nccl.Logger
	r        *region
	secret   []byte
	accepted bool
	warned   bool
}

// Accept implements nccl.Listener: one look at the state word.
func (l *listener) Accept() (nccl.RecvComm, error) {
	if l.accepted {
		return nil, nccl.Errorf(nccl.InternalError, "NET/Shm : accept called again after a connection was accepted (one connection per listen)")
	}
	if l.r == nil {
		return nil, nccl.Errorf(nccl.InternalError, "NET/Shm : accept on a closed listener")
	}
	h := l.r.h
	if h.u32(offState).Load() != stProved {
		return nil, nil
	}
	pid := h.u64(h.side(sideSend, sidePid)).Load()
	nonce := h.bytes(offNonce, 32)
	if !hmac.Equal(proof(l.secret, "connect", nonce, pid), h.bytes(offConnProof, 32)) {
		if !l.warned {
			l.warned = true
			l.log.Warnf("NET/Shm : process %d tried to connect to %s with a wrong secret (a stale or corrupted handle); still waiting for the right peer", pid, l.r.path)
		}
		h.u32(offState).Store(stRejected)
		return nil, nil
	}
	copy(h.bytes(offAcceptProof, 32), proof(l.secret, "accept", nonce, pid))
	h.u32(offState).Store(stAccepted)
	l.r.unlink(l.log) // both ends have it mapped; nothing may outlive them
	rc := newRecvComm(l.r, l.log, peerTimeout(l.log))
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
	stopBeating(l.r)
	l.r.unlink(l.log)
	l.r.unmap()
	l.r = nil
	return nil
}

// pendingConnect is a connect NCCL is still polling.
type pendingConnect struct {
	r      *region
	secret []byte
	w      peerWatch
}

func (pc *pendingConnect) release() {
	if pc.r != nil {
		pc.w.close()
		stopBeating(pc.r)
		pc.r.unmap()
		pc.r = nil
	}
}

// Connect implements nccl.Transport. The first call maps the file, claims it
// and writes the proof; later calls (same handle buffer) look whether the
// listener accepted. None of them waits.
func (t *Transport) Connect(dev int, handle *nccl.Handle, _ nccl.ConnectOptions) (nccl.SendComm, error) {
	if dev != 0 {
		return nil, nccl.Errorf(nccl.InvalidArgument, "NET/Shm : connect on device %d; shm has one device, 0", dev)
	}
	if binary.LittleEndian.Uint64(handle[0:]) == pendingMagic {
		id := binary.LittleEndian.Uint64(handle[8:])
		t.mu.Lock()
		pc := t.pending[id]
		t.mu.Unlock()
		if pc == nil {
			return nil, nccl.Errorf(nccl.InternalError, "NET/Shm : connect retried with attempt %d, which failed or completed already", id)
		}
		return t.advance(id, pc, handle)
	}
	boot, secret, path, err := decodeHandle(handle)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	myBoot, ready := t.boot, t.ready
	t.mu.Unlock()
	if !ready {
		return nil, nccl.Errorf(nccl.InternalError, "NET/Shm : connect before init")
	}
	if boot != ([16]byte{}) && myBoot != ([16]byte{}) && boot != myBoot {
		return nil, nccl.Errorf(nccl.SystemError, "NET/Shm : the listener of %s runs on another host; the shm transport only connects ranks of one host (use it for single-node jobs, or another NCCL_NET_PLUGIN)", path)
	}
	r, err := openRegion(path)
	if err != nil {
		return nil, err
	}
	h := r.h
	if !h.u32(offState).CompareAndSwap(stListening, stClaimed) {
		st := h.u32(offState).Load()
		r.unmap()
		if st == stListenerClosed {
			return nil, nccl.Errorf(nccl.SystemError, "NET/Shm : the listener of %s closed before this connect", path)
		}
		return nil, nccl.Errorf(nccl.InvalidUsage, "NET/Shm : %s already has a connector (state %d); NCCL connects once per listen handle", path, st)
	}
	pid := uint64(os.Getpid())
	h.u64(h.side(sideSend, sidePid)).Store(pid)
	h.u64(h.side(sideSend, sidePidNS)).Store(pidNS())
	startBeating(r, sideSend)
	copy(h.bytes(offConnProof, 32), proof(secret, "connect", h.bytes(offNonce, 32), pid))
	h.u32(offState).Store(stProved)

	pc := &pendingConnect{r: r, secret: secret, w: newPeerWatch(r, sideRecv, peerTimeout(t.logger()))}
	t.mu.Lock()
	t.nextID++
	id := t.nextID
	t.pending[id] = pc
	t.mu.Unlock()
	*handle = nccl.Handle{} // the secret is not needed in this copy any more
	binary.LittleEndian.PutUint64(handle[0:], pendingMagic)
	binary.LittleEndian.PutUint64(handle[8:], id)
	return t.advance(id, pc, handle)
}

func (t *Transport) advance(id uint64, pc *pendingConnect, handle *nccl.Handle) (nccl.SendComm, error) {
	h := pc.r.h
	fail := func(err error) (nccl.SendComm, error) {
		t.mu.Lock()
		delete(t.pending, id)
		t.mu.Unlock()
		pc.release()
		*handle = nccl.Handle{}
		return nil, err
	}
	switch st := h.u32(offState).Load(); st {
	case stAccepted:
		nonce := h.bytes(offNonce, 32)
		if !hmac.Equal(proof(pc.secret, "accept", nonce, h.u64(h.side(sideSend, sidePid)).Load()), h.bytes(offAcceptProof, 32)) {
			return fail(nccl.Errorf(nccl.SystemError, "NET/Shm : the listener of %s answered without knowing the handle's secret", pc.r.path))
		}
		t.mu.Lock()
		delete(t.pending, id)
		t.mu.Unlock()
		sc := newSendComm(pc.r, pc.w, t.logger())
		pc.r = nil
		return sc, nil
	case stRejected:
		h.u32(offState).CompareAndSwap(stRejected, stListening) // let the right peer in
		return fail(nccl.Errorf(nccl.InvalidUsage, "NET/Shm : the listener of %s rejected this connect: the handle's secret does not match (a stale or corrupted handle)", pc.r.path))
	case stListenerClosed:
		return fail(nccl.Errorf(nccl.SystemError, "NET/Shm : the listener of %s closed before accepting", pc.r.path))
	case stProved:
		if err := pc.w.check(now()); err != nil {
			return fail(err)
		}
		return nil, nil
	default:
		return fail(nccl.Errorf(nccl.InternalError, "NET/Shm : %s is in unexpected state %d during connect", pc.r.path, st))
	}
}
