package shm

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Orphaned connection files. A listener unlinks its file when it accepts or
// closes; a process killed before either leaves the file (its ring memory
// with it) in NCCL_GO_SHM_DIR. The next Init of any process using that
// directory, and a Listen that finds it full, sweep it: a file is removed
// only when both ends' lock bytes (liveness.go) can be taken, that is when
// no process holds either end, whatever the pids in its name or header say
// (pids repeat across PID namespaces and are reused). The sweep takes those
// bytes with non-blocking OFD locks: they conflict with the ends' POSIX
// locks, belong to the sweep's own descriptor, and go with it.
//
// POSIX locks belong to a process, and closing any descriptor of a file
// drops all of the process's locks on it. So this process keeps a table of
// the connection files it has open: the sweep never opens one of them, and a
// region released while another region of this process still has its file
// open (a listener and a connector in one process) only unlocks its own byte
// and leaves its descriptor open until the last of them goes.

// fileID names an inode.
type fileID struct{ dev, ino uint64 }

func statID(st *unix.Stat_t) fileID { return fileID{uint64(st.Dev), uint64(st.Ino)} }

// procFile is one connection file this process has open.
type procFile struct {
	users  int    // regions with a descriptor of it
	locked [2]int // of those, how many hold each side's lock
	parked []int  // descriptors of released regions, closed with the last one
}

var procFiles = struct {
	sync.Mutex
	m map[fileID]*procFile
}{m: map[fileID]*procFile{}}

// trackFD enters a descriptor of a connection file into the table and fills
// st. On error fd is still the caller's.
func trackFD(fd int, st *unix.Stat_t) (fileID, error) {
	if err := unix.Fstat(fd, st); err != nil {
		return fileID{}, err
	}
	id := statID(st)
	procFiles.Lock()
	defer procFiles.Unlock()
	f := procFiles.m[id]
	if f == nil {
		f = &procFile{}
		procFiles.m[id] = f
	}
	f.users++
	return id, nil
}

// lockTracked takes side's lock through a tracked descriptor (lockSide).
func lockTracked(fd int, id fileID, side int) error {
	procFiles.Lock()
	defer procFiles.Unlock()
	if err := lockSide(fd, side); err != nil {
		return err
	}
	procFiles.m[id].locked[side]++
	return nil
}

// untrackFD gives up a tracked descriptor that holds side's lock (-1: none).
// The byte is unlocked unless another region of this process holds the same
// side; the descriptor is closed with the file's last one.
func untrackFD(fd int, id fileID, side int) {
	procFiles.Lock()
	defer procFiles.Unlock()
	f := procFiles.m[id]
	if f == nil { // not tracked: no lock of this process can depend on it
		_ = unix.Close(fd)
		return
	}
	if side >= 0 {
		if f.locked[side]--; f.locked[side] == 0 {
			_ = unlockSide(fd, side)
		}
	}
	if f.users--; f.users > 0 {
		f.parked = append(f.parked, fd)
		return
	}
	delete(procFiles.m, id)
	_ = unix.Close(fd)
	for _, p := range f.parked {
		_ = unix.Close(p)
	}
}

// unlockSide releases this process's lock on side's byte.
func unlockSide(fd, side int) error {
	lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: io.SeekStart, Start: int64(offSides + side*sideSize + sideLock), Len: 1}
	return unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &lk)
}

// sweepLockSide tries side's byte with an OFD write lock, without waiting.
func sweepLockSide(fd, side int) error {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: int64(offSides + side*sideSize + sideLock), Len: 1}
	return unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk)
}

// unlinkIfSame removes path if it still names the inode id.
func unlinkIfSame(path string, id fileID) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return err
	}
	if statID(&st) != id {
		return unix.ENOENT // replaced: ours is gone already
	}
	return unix.Unlink(path)
}

// sweep removes the connection files in dir that no live process holds. It
// reads the directory once, looks only at names Listen makes, never waits for
// a lock, and logs instead of failing. It returns how many it removed.
func sweep(dir string, log nccl.Logger) int {
	d, err := os.Open(dir)
	if err != nil {
		log.Warnf("%s : cannot look for orphaned connection files in %s: %v", logPrefix, dir, err)
		return 0
	}
	names, err := d.Readdirnames(-1)
	_ = d.Close()
	if err != nil {
		log.Warnf("%s : cannot look for orphaned connection files in %s: %v", logPrefix, dir, err)
		return 0
	}
	removed, failed := 0, 0
	var first error
	for _, name := range names {
		if !strings.HasPrefix(name, connFilePrefix) {
			continue
		}
		path := filepath.Join(dir, name)
		if !isConnPath(path) {
			continue
		}
		ok, err := sweepFile(path)
		switch {
		case err != nil:
			if failed++; first == nil {
				first = err
			}
		case ok:
			removed++
		}
	}
	if removed > 0 {
		log.Infof(nccl.SubsysInit|nccl.SubsysNet, "%s : removed %d connection file(s) in %s that processes killed before accepting had left", logPrefix, removed, dir)
	}
	if failed > 0 {
		log.Warnf("%s : could not check %d connection file(s) in %s for a live owner, so they stay (first: %v); delete those of dead jobs by hand", logPrefix, failed, dir, first)
	}
	return removed
}

// sweepFile removes path if neither end of it is held by a live process. A
// file that vanished, is not a regular file or belongs to another user (it
// cannot be opened for writing) is left alone without an error.
func sweepFile(path string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, nil
	}
	id := statID(&st)
	procFiles.Lock() // no region of this process opens or locks a file meanwhile
	defer procFiles.Unlock()
	if procFiles.m[id] != nil {
		return false, nil // ours: alive
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.ELOOP) {
			return false, nil
		}
		return false, err
	}
	if err := unix.Fstat(fd, &st); err != nil || statID(&st) != id {
		if f := procFiles.m[statID(&st)]; err == nil && f != nil {
			// The name now points at a file of ours: closing this descriptor
			// would drop our locks on it, so it waits for that file's last one.
			f.parked = append(f.parked, fd)
			return false, nil
		}
		_ = unix.Close(fd)
		return false, err
	}
	defer unix.Close(fd)
	for _, side := range []int{sideRecv, sideSend} {
		if err := sweepLockSide(fd, side); err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
				return false, nil // that end lives
			}
			return false, err
		}
	}
	if err := unlinkIfSame(path, id); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}
