package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openTAP creates (or attaches to) the TAP device name in the calling
// process's network namespace and sets its MTU. Frames are read and written
// whole, without the packet-information prefix. The device lives as long
// as the file stays open; it may be moved to another namespace meanwhile
// (ip link set NAME netns NS) and keeps relaying.
func openTAP(name string, mtu int) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w (is the tun driver present? modprobe tun)", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TAP name %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s: %w (creating a TAP device needs CAP_NET_ADMIN)", name, err)
	}
	if err := setMTU(name, mtu); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// Non-blocking before NewFile: the file joins Go's poller, so a Read
	// parks instead of holding a thread, and Close wakes it.
	return os.NewFile(uintptr(fd), "tap:"+name), nil
}

func setMTU(name string, mtu int) error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket for SIOCSIFMTU: %w", err)
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	ifr.SetUint32(uint32(mtu))
	if err := unix.IoctlIfreq(s, unix.SIOCSIFMTU, ifr); err != nil {
		return fmt.Errorf("setting MTU %d on %s: %w", mtu, name, err)
	}
	return nil
}
