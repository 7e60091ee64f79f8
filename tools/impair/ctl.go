package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// The control protocol: one command per line on a Unix socket, one reply
// line per command ("ok ..." or "error: ..."). The fault lane drives the
// relay with it between and during scenarios:
//
//	set [a>b|b>a|both] [loss=PCT] [delay=DUR] [jitter=DUR]   (unnamed keys keep their value)
//	down [DUR]          drop everything, both directions, for DUR (no DUR: until "up")
//	up                  end a down window now
//	blackhole add|del ADDR
//	reset               no impairment, link up, no black holes, counters zeroed
//	show                current settings
//	stats               counters per direction
const maxCommandLen = 512

type cmdKind int

const (
	cmdSet cmdKind = iota + 1
	cmdDown
	cmdUp
	cmdBlackhole
	cmdReset
	cmdShow
	cmdStats
)

type command struct {
	kind cmdKind
	dirs []int // cmdSet
	// cmdSet: which fields were given
	loss, delay, jitter bool
	im                  impairment
	dur                 time.Duration // cmdDown
	addr                netip.Addr    // cmdBlackhole
	on                  bool          // cmdBlackhole: add
}

var errUsage = errors.New("usage: set [a>b|b>a|both] [loss=PCT] [delay=DUR] [jitter=DUR] | down [DUR] | up | " +
	"blackhole add|del ADDR | reset | show | stats")

func parseCommand(line string) (command, error) {
	var c command
	if len(line) > maxCommandLen {
		return c, fmt.Errorf("command longer than %d bytes", maxCommandLen)
	}
	f := strings.Fields(line)
	if len(f) == 0 {
		return c, errUsage
	}
	args := f[1:]
	switch f[0] {
	case "set":
		c.kind = cmdSet
		c.dirs = []int{ab, ba}
		if len(args) > 0 && !strings.Contains(args[0], "=") {
			switch args[0] {
			case "a>b", "ab":
				c.dirs = []int{ab}
			case "b>a", "ba":
				c.dirs = []int{ba}
			case "both":
			default:
				return c, fmt.Errorf("set: direction %q: use a>b, b>a or both", args[0])
			}
			args = args[1:]
		}
		if len(args) == 0 {
			return c, fmt.Errorf("set: nothing to set (loss=, delay=, jitter=)")
		}
		for _, a := range args {
			k, v, ok := strings.Cut(a, "=")
			if !ok {
				return c, fmt.Errorf("set: %q is not key=value", a)
			}
			var err error
			switch k {
			case "loss":
				c.loss = true
				c.im.loss, err = parsePercent(v)
			case "delay":
				c.delay = true
				c.im.delay, err = parseNonNegDuration(v)
			case "jitter":
				c.jitter = true
				c.im.jitter, err = parseNonNegDuration(v)
			default:
				return c, fmt.Errorf("set: unknown key %q (loss, delay, jitter)", k)
			}
			if err != nil {
				return c, fmt.Errorf("set %s: %w", k, err)
			}
		}
	case "down":
		c.kind = cmdDown
		switch len(args) {
		case 0:
		case 1:
			d, err := parseNonNegDuration(args[0])
			if err != nil {
				return c, fmt.Errorf("down: %w", err)
			}
			c.dur = d
		default:
			return c, errUsage
		}
	case "blackhole":
		c.kind = cmdBlackhole
		if len(args) != 2 || (args[0] != "add" && args[0] != "del") {
			return c, errUsage
		}
		a, err := netip.ParseAddr(args[1])
		if err != nil {
			return c, fmt.Errorf("blackhole: %w", err)
		}
		c.addr, c.on = a, args[0] == "add"
	case "up", "reset", "show", "stats":
		if len(args) != 0 {
			return c, errUsage
		}
		c.kind = map[string]cmdKind{"up": cmdUp, "reset": cmdReset, "show": cmdShow, "stats": cmdStats}[f[0]]
	default:
		return c, errUsage
	}
	return c, nil
}

// parsePercent reads "1", "1%" or "0.5%" as a probability.
func parsePercent(v string) (float64, error) {
	p, err := strconv.ParseFloat(strings.TrimSuffix(v, "%"), 64)
	if err != nil || p < 0 || p > 100 || p != p {
		return 0, fmt.Errorf("%q is not a percentage in 0..100", v)
	}
	return p / 100, nil
}

func parseNonNegDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > 24*time.Hour {
		return 0, fmt.Errorf("%q is not a duration between 0 and 24h (e.g. 10ms, 5s)", v)
	}
	return d, nil
}

// apply executes c and returns the reply line.
func (r *relay) apply(c command) string {
	l := r.link
	switch c.kind {
	case cmdSet:
		for _, d := range c.dirs {
			im := l.impairmentOf(d)
			if c.loss {
				im.loss = c.im.loss
			}
			if c.delay {
				im.delay = c.im.delay
			}
			if c.jitter {
				im.jitter = c.im.jitter
			}
			l.setImpairment(d, im)
		}
		return "ok " + r.show()
	case cmdDown:
		l.setDown(r.now(), c.dur)
		if c.dur > 0 {
			return fmt.Sprintf("ok down for %v", c.dur)
		}
		return "ok down until up"
	case cmdUp:
		l.setUp()
		return "ok up"
	case cmdBlackhole:
		l.setBlackhole(c.addr, c.on)
		return "ok " + r.show()
	case cmdReset:
		for d := range 2 {
			l.setImpairment(d, impairment{})
		}
		l.setUp()
		l.mu.Lock()
		clear(l.blackhole)
		l.mu.Unlock()
		r.stats[ab].reset()
		r.stats[ba].reset()
		return "ok " + r.show()
	case cmdShow:
		return "ok " + r.show()
	case cmdStats:
		return "ok " + r.statsLine()
	}
	return "error: " + errUsage.Error()
}

func (r *relay) show() string {
	l := r.link
	now := r.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	state := "up"
	switch {
	case l.downUntil.Equal(forever):
		state = "down until up"
	case now.Before(l.downUntil):
		state = fmt.Sprintf("down for %v more", l.downUntil.Sub(now).Round(time.Millisecond))
	}
	var bh []string
	for a := range l.blackhole {
		bh = append(bh, a.String())
	}
	return fmt.Sprintf("link %s; %s: %v; %s: %v; blackhole [%s]", state, dirNames[ab], l.dir[ab], dirNames[ba], l.dir[ba],
		strings.Join(bh, " "))
}

// serveControl answers commands on ln until it is closed.
func (r *relay) serveControl(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go r.serveConn(c)
	}
}

func (r *relay) serveConn(c net.Conn) {
	defer c.Close()
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, maxCommandLen+1), maxCommandLen+1)
	for sc.Scan() {
		reply := ""
		cmd, err := parseCommand(sc.Text())
		if err != nil {
			reply = "error: " + err.Error()
		} else {
			reply = r.apply(cmd)
		}
		if _, err := fmt.Fprintln(c, reply); err != nil {
			return
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(c, "error: %v\n", err)
	}
}
