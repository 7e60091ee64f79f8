package main

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseCommand(t *testing.T) {
	for _, tc := range []struct {
		line string
		ok   bool
		want command
	}{
		{"set loss=1% delay=10ms", true, command{kind: cmdSet, dirs: []int{ab, ba}, loss: true, delay: true,
			im: impairment{loss: 0.01, delay: 10 * time.Millisecond}}},
		{"set a>b jitter=2ms", true, command{kind: cmdSet, dirs: []int{ab}, jitter: true, im: impairment{jitter: 2 * time.Millisecond}}},
		{"set ba loss=0.5", true, command{kind: cmdSet, dirs: []int{ba}, loss: true, im: impairment{loss: 0.005}}},
		{"down", true, command{kind: cmdDown}},
		{"down 5s", true, command{kind: cmdDown, dur: 5 * time.Second}},
		{"up", true, command{kind: cmdUp}},
		{"blackhole add 198.18.1.1", true, command{kind: cmdBlackhole, addr: netip.MustParseAddr("198.18.1.1"), on: true}},
		{"blackhole del fd00::1", true, command{kind: cmdBlackhole, addr: netip.MustParseAddr("fd00::1")}},
		{"  reset  ", true, command{kind: cmdReset}},
		{"stats", true, command{kind: cmdStats}},
		{"", false, command{}},
		{"set", false, command{}},
		{"set sideways loss=1", false, command{}},
		{"set loss=101%", false, command{}},
		{"set loss=-1", false, command{}},
		{"set loss=NaN", false, command{}},
		{"set delay=-5ms", false, command{}},
		{"set delay=forever", false, command{}},
		{"set speed=1", false, command{}},
		{"set loss", false, command{}},
		{"down 5s 6s", false, command{}},
		{"down soon", false, command{}},
		{"blackhole add", false, command{}},
		{"blackhole add not-an-ip", false, command{}},
		{"up now", false, command{}},
		{"reboot", false, command{}},
		{"set " + strings.Repeat("x", maxCommandLen), false, command{}},
	} {
		got, err := parseCommand(tc.line)
		if (err == nil) != tc.ok {
			t.Errorf("%q: err = %v, want ok = %v", tc.line, err, tc.ok)
			continue
		}
		if tc.ok && fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%q:\n got %+v\nwant %+v", tc.line, got, tc.want)
		}
	}
}

// The control socket end to end, as the lane uses it.
func TestControlSocket(t *testing.T) {
	r, a, b := startRelay(t, newLink(1), 16)
	a.tx <- tcpFrame(0)
	b.recv(t)
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go r.serveControl(ln)
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rd := bufio.NewReader(c)
	ask := func(cmd string) string {
		t.Helper()
		fmt.Fprintln(c, cmd)
		reply, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		return strings.TrimSpace(reply)
	}
	for _, tc := range []struct{ cmd, want string }{
		{"set loss=1% delay=10ms", "ok link up; a>b: loss 1% delay 10ms jitter 0s; b>a: loss 1% delay 10ms jitter 0s"},
		{"set b>a delay=0s", "b>a: loss 1% delay 0s jitter 0s"},
		{"down 1h", "ok down for 1h0m0s"},
		{"show", "ok link down for 1h0m0s more"},
		{"blackhole add 198.18.1.1", "blackhole [198.18.1.1]"},
		{"reset", "ok link up; a>b: loss 0% delay 0s jitter 0s; b>a: loss 0% delay 0s jitter 0s; blackhole []"},
		{"stats", "ok a>b: 0 frames"}, // reset zeroed the frame counted before
		{"fly", "error: usage:"},
	} {
		if got := ask(tc.cmd); !strings.Contains(got, tc.want) {
			t.Errorf("%s: reply %q does not contain %q", tc.cmd, got, tc.want)
		}
	}
}
