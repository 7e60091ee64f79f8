package ib

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// TestForeignServerReplyIsNotALinkLayerMismatch: a stale handle whose port
// another service took over (sshd, an HTTP server) answers the hello with
// its own bytes. That is a connection to the wrong process, a SystemError
// that says so, not "incompatible devices … NCCL_IB_HCA" (InvalidUsage),
// which sends the user to the wrong setting.
func TestForeignServerReplyIsNotALinkLayerMismatch(t *testing.T) {
	setEnv(t, "NCCL_GO_TIMEOUT", "5")
	_, a, _ := twoHosts(t, softnic.DeviceConfig{})
	for name, banner := range map[string]string{
		"ssh banner":      "SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n",
		"http response":   "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
		"zeros then junk": "\x00\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\xff\xff\xff\xff",
	} {
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				_, _ = c.Write([]byte(banner))
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, _ = c.Read(make([]byte, 4096))
			}()
			var h nccl.Handle
			writeHandle(&h, handleInfo{magic: ncclsock.DefaultMagic, secret: 1, addr: ln.Addr().(*net.TCPAddr).AddrPort()})
			_, err = connectError(t, a.t, &h, 10*time.Second)
			require.Error(t, err)
			assert.Equal(t, nccl.SystemError, nccl.ResultOf(err), "%v", err)
			assert.NotContains(t, err.Error(), "incompatible devices")
			assert.NotContains(t, err.Error(), "NCCL_IB_HCA")
		})
	}
}
