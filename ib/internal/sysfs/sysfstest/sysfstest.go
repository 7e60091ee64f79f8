// Package sysfstest builds the sysfs fixture tree that tests of ib's sysfs
// reader and of ib's discovery point their root at. The plain files live in
// ib/internal/sysfs/testdata/sys; what a Go module zip cannot carry (PCI
// directory names contain ':', and zips leave symbolic links out) is added
// here, in a temporary copy, so that the module stays fetchable with go get
// (internal/modzip).
package sysfstest

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// PCI maps each fixture device to its PCI path under /sys/devices.
var PCI = map[string]string{
	"mlx5_0": "pci0000:00/0000:00:03.0/0000:03:00.0",
	"mlx5_1": "pci0000:00/0000:00:04.0/0000:04:00.1",
}

// Tree returns the root of a complete copy of the fixture, removed when t ends:
// testdata/sys plus each device's PCI directory and its
// class/infiniband/<dev>/device link.
func Tree(t testing.TB) string {
	t.Helper()
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("sysfstest: cannot locate the fixture's source directory")
	}
	src := filepath.Join(filepath.Dir(self), "..", "testdata", "sys")
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS(src)); err != nil {
		t.Fatalf("sysfstest: copying %s: %v", src, err)
	}
	for dev, pci := range PCI {
		if err := os.MkdirAll(filepath.Join(root, "devices", pci), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("../../../devices/"+pci, filepath.Join(root, "class", "infiniband", dev, "device")); err != nil {
			t.Fatal(err)
		}
	}
	return root
}
