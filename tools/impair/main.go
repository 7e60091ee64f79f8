// Command impair relays Ethernet frames between two TAP devices and impairs
// them in user space: loss, delay, jitter, a down window, black-holed
// addresses. It stands in for sch_netem, which the project's CI kernels lack,
// in the fault lane (scripts/faults/run.sh, docs/reliability.md): put one TAP
// in each of two network namespaces and the relay is the wire between them.
//
//	impair run -a TAP_A -b TAP_B -ctl SOCKET [-mtu 1500] [-limit 16384] [-seed N]
//	           [-loss PCT] [-delay DUR] [-jitter DUR]
//	impair ctl -ctl SOCKET COMMAND...
//
// run creates both TAP devices in its own network namespace (move them
// afterwards with ip link set NAME netns NS), answers control commands on
// SOCKET (see ctl.go for the list), prints "ready" once both are up, and on
// SIGINT/SIGTERM prints its counters and exits. ctl sends one command and
// prints the reply; it exits 1 when the relay answered with an error.
package main

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: impair run|ctl ... (impair run -h, impair ctl -h)")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = runMain(os.Args[2:])
	case "ctl":
		err = ctlMain(os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q: use run or ctl", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "impair:", err)
		os.Exit(1)
	}
}

func runMain(args []string) error {
	fs := flag.NewFlagSet("impair run", flag.ContinueOnError)
	a := fs.String("a", "", "TAP device of side a (created)")
	b := fs.String("b", "", "TAP device of side b (created)")
	ctl := fs.String("ctl", "", "Unix socket for control commands")
	mtu := fs.Int("mtu", 1500, "MTU of both TAP devices")
	limit := fs.Int("limit", 16384, "frames on the wire per direction before tail drop")
	seed := fs.Uint64("seed", 0, "loss/jitter random seed (0: random, printed)")
	loss := fs.String("loss", "0", "initial loss in percent, both directions")
	delay := fs.Duration("delay", 0, "initial one-way delay, both directions")
	jitter := fs.Duration("jitter", 0, "initial jitter, both directions")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *a == "" || *b == "" || *ctl == "" || fs.NArg() != 0 {
		return fmt.Errorf("run needs -a, -b and -ctl (and no other arguments)")
	}
	if *mtu < 68 || *mtu > 65535 || *limit < 1 || *limit > 1<<20 {
		return fmt.Errorf("-mtu must be in 68..65535 and -limit in 1..1048576")
	}
	lp, err := parsePercent(*loss)
	if err != nil {
		return fmt.Errorf("-loss: %w", err)
	}
	if *delay < 0 || *jitter < 0 {
		return fmt.Errorf("-delay and -jitter must not be negative")
	}
	if *seed == 0 {
		var s [8]byte
		rand.Read(s[:])
		*seed = binary.LittleEndian.Uint64(s[:]) | 1
	}
	ta, err := openTAP(*a, *mtu)
	if err != nil {
		return err
	}
	tb, err := openTAP(*b, *mtu)
	if err != nil {
		ta.Close()
		return err
	}
	os.Remove(*ctl)
	ln, err := net.Listen("unix", *ctl)
	if err != nil {
		ta.Close()
		tb.Close()
		return fmt.Errorf("control socket: %w", err)
	}
	l := newLink(*seed)
	for d := range 2 {
		l.setImpairment(d, impairment{loss: lp, delay: *delay, jitter: *jitter})
	}
	r := newRelay(l, ta, tb, *mtu, *limit)
	r.start()
	go r.serveControl(ln)
	fmt.Printf("impair: relaying %s <-> %s, mtu %d, limit %d, seed %d; %s; control %s\nready\n", *a, *b, *mtu, *limit, *seed,
		r.show(), *ctl)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	ln.Close()
	err = r.stop()
	fmt.Printf("impair: stopped; %s\n", r.statsLine())
	return err
}

func ctlMain(args []string) error {
	fs := flag.NewFlagSet("impair ctl", flag.ContinueOnError)
	ctl := fs.String("ctl", "", "the relay's control socket")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the relay")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *ctl == "" || fs.NArg() == 0 {
		return fmt.Errorf("ctl needs -ctl SOCKET and a command")
	}
	c, err := net.DialTimeout("unix", *ctl, *timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(*timeout))
	if _, err := fmt.Fprintln(c, strings.Join(fs.Args(), " ")); err != nil {
		return err
	}
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("no reply from the relay: %w", err)
	}
	fmt.Print(reply)
	if !strings.HasPrefix(reply, "ok") {
		return fmt.Errorf("the relay refused the command")
	}
	return nil
}
