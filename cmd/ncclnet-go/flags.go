package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// errHelpShown ends a subcommand after --help printed its usage.
var errHelpShown = errors.New("help shown")

// flags is a subcommand's flag set with its help text.
type flags struct {
	*flag.FlagSet
	c                     *cli
	name, synopsis, about string
}

// newFlags makes a subcommand's flag set. Parse errors become one-line usage
// errors; --help prints the usage to stdout.
func newFlags(c *cli, name, synopsis, about string) *flags {
	fs := flag.NewFlagSet("ncclnet-go "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {} // parse errors are reported as one line by run
	return &flags{FlagSet: fs, c: c, name: name, synopsis: synopsis, about: about}
}

func (f *flags) usage() {
	w := f.c.stdout
	fmt.Fprintf(w, "usage: ncclnet-go %s %s\n\n%s\n", f.name, f.synopsis, strings.TrimSpace(f.about))
	first := true
	f.VisitAll(func(fl *flag.Flag) {
		if first {
			fmt.Fprintf(w, "\nflags:\n")
			first = false
		}
		arg, help := flag.UnquoteUsage(fl)
		head := "  --" + fl.Name
		if len(fl.Name) == 1 {
			head = "  -" + fl.Name
		}
		if arg != "" {
			head += " " + arg
		}
		if fl.DefValue != "" && fl.DefValue != "false" && fl.DefValue != "0" && fl.DefValue != "0s" {
			help += " (default " + fl.DefValue + ")"
		}
		if len(head) <= 22 {
			fmt.Fprintf(w, "%-24s%s\n", head, help)
		} else {
			fmt.Fprintf(w, "%s\n%24s%s\n", head, "", help)
		}
	})
}

// parse parses args, turning -h/--help into errHelpShown and anything wrong
// into a usageError.
func (f *flags) parse(args []string) error {
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			f.usage()
			return errHelpShown
		}
		return usageError{err.Error()}
	}
	return nil
}

// parseInterleaved is parse for commands that take positional arguments
// mixed with flags (top ADDR... --once): it returns the positionals.
func (f *flags) parseInterleaved(args []string) ([]string, error) {
	var pos []string
	for {
		if err := f.parse(args); err != nil {
			return nil, err
		}
		rest := f.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}
