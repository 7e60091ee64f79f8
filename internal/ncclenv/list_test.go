package ncclenv

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func e(name string, port int) Entry { return Entry{Name: name, Port: port, Rail: -1, Plane: -1} }

func TestParseListLikeParseStringList(t *testing.T) {
	for _, c := range []struct {
		in      string
		exclude bool
		exact   bool
		entries []Entry
		notes   int
	}{
		// NCCL's documented NCCL_SOCKET_IFNAME examples.
		{"eth", false, false, []Entry{e("eth", -1)}, 0},
		{"=eth0", false, true, []Entry{e("eth0", -1)}, 0},
		{"=eth0,eth1", false, true, []Entry{e("eth0", -1), e("eth1", -1)}, 0},
		{"^docker", true, false, []Entry{e("docker", -1)}, 0},
		{"^=docker0", true, true, []Entry{e("docker0", -1)}, 0},
		// NCCL's documented NCCL_IB_HCA examples.
		{"mlx5", false, false, []Entry{e("mlx5", -1)}, 0},
		{"=mlx5_0:1,mlx5_1:1", false, true, []Entry{e("mlx5_0", 1), e("mlx5_1", 1)}, 0},
		{"^=mlx5_1,mlx5_4", true, true, []Entry{e("mlx5_1", -1), e("mlx5_4", -1)}, 0},
		// NCCL 2.30 rail and plane fields; empty fields are "absent".
		{"mlx5_0:1:2:3", false, false, []Entry{{"mlx5_0", 1, 2, 3}}, 0},
		{"mlx5_0::4", false, false, []Entry{{"mlx5_0", -1, 4, -1}}, 0},
		{"mlx5_0:", false, false, []Entry{e("mlx5_0", -1)}, 0},
		// strtok: empty entries vanish; an entry without a name is skipped.
		{",,eth0,,", false, false, []Entry{e("eth0", -1)}, 0},
		{":1,eth0", false, false, []Entry{e("eth0", -1)}, 1},
		{"^", true, false, nil, 0},
		{"", false, false, nil, 0},
		// atoi: garbage reads as 0 (which matches no port), leading digits count.
		{"ib0:x", false, false, []Entry{e("ib0", 0)}, 1},
		{"mlx5_0:1x", false, false, []Entry{e("mlx5_0", 1)}, 1},
		{"mlx5_0:0", false, false, []Entry{e("mlx5_0", 0)}, 1},
		{"mlx5_0:1:2:3:4", false, false, []Entry{{"mlx5_0", 1, 2, 3}}, 1},
		{"eth0, eth1", false, false, []Entry{e("eth0", -1), e(" eth1", -1)}, 1},
		// '=' then '^' is not an exclusion: NCCL strips '^' first only.
		{"=^eth0", false, true, []Entry{e("^eth0", -1)}, 0},
	} {
		l, notes := ParseList(c.in, MaxIBDevs)
		assert.Equal(t, c.exclude, l.Exclude, c.in)
		assert.Equal(t, c.exact, l.Exact, c.in)
		assert.Equal(t, c.entries, l.Entries, c.in)
		assert.Len(t, notes, c.notes, "%q: %v", c.in, notes)
	}
}

func TestParseListKeepsTheFirstMaxEntries(t *testing.T) {
	var names []string
	for i := 0; i < 20; i++ {
		names = append(names, fmt.Sprintf("eth%d", i))
	}
	l, notes := ParseList(strings.Join(names, ","), MaxIfs)
	assert.Len(t, l.Entries, MaxIfs)
	assert.Equal(t, "eth15", l.Entries[MaxIfs-1].Name)
	assert.Equal(t, []string{"more than 16 entries; NCCL uses the first 16 and ignores 4"}, notes)
}

func TestListNotesSayWhatNCCLDoes(t *testing.T) {
	_, notes := ParseList("mlx5_0:x", MaxIBDevs)
	assert.Equal(t, []string{`port "x" in entry "mlx5_0:x" is not a decimal number; NCCL reads it as 0`}, notes)
	_, notes = ParseList("mlx5_0:0", MaxIBDevs)
	assert.Contains(t, notes[0], "matches no port")
}

func TestListMatchLikeMatchIfList(t *testing.T) {
	for _, c := range []struct {
		list, name string
		port       int
		want       bool
	}{
		{"eth", "eth0", -1, true},
		{"eth", "eth10", -1, true},
		{"eth", "ens3", -1, false},
		{"=eth0", "eth0", -1, true},
		{"=eth0", "eth01", -1, false},
		{"=eth0,eth1", "eth1", -1, true},
		{"^eth", "eth0", -1, false},
		{"^eth", "ib0", -1, true},
		{"^docker", "docker0", -1, false},
		{"^=docker0", "docker0", -1, false},
		{"^=docker0", "docker01", -1, true},
		{"^docker,lo,virbr", "lo", -1, false},
		{"^docker,lo,virbr", "lowpan0", -1, false}, // prefixes: "lo" excludes lo*
		{"^docker,lo,virbr", "enp1s0", -1, true},
		{"eth0:5555", "eth0", -1, true}, // interfaces pass no port: any entry port matches
		{"^", "eth0", -1, false},        // an empty exclusion list selects nothing
		{"", "eth0", -1, true},          // no list selects everything
		// HCA ports.
		{"mlx5_0:1,mlx5_1", "mlx5_0", 1, true},
		{"mlx5_0:1,mlx5_1", "mlx5_0", 2, false},
		{"mlx5_0:1,mlx5_1", "mlx5_1", 2, true},
		{"mlx5", "mlx5_10", 1, true},
		{"=mlx5_1", "mlx5_10", 1, false},
		{"^=mlx5_1", "mlx5_10", 1, true},
		{"^mlx5_0:1", "mlx5_0", 1, false},
		{"^mlx5_0:1", "mlx5_0", 2, true},
		{"mlx5_0:x", "mlx5_0", 1, false}, // atoi("x") = 0: no port 0 exists
		{"mlx5_0:-1", "mlx5_0", 3, true}, // atoi("-1") = -1: any port, as in NCCL
		{"mlx5_0:1:0:1", "mlx5_0", 1, true},
	} {
		l, _ := ParseList(c.list, MaxIBDevs)
		assert.Equal(t, c.want, l.Match(c.name, c.port), "%q matching %s:%d", c.list, c.name, c.port)
	}
}

func TestMatchEntryGivesRailAndPlane(t *testing.T) {
	l, _ := ParseList("mlx5_0:1:0:0,mlx5_0:2:0:1,mlx5_1:1:1:0", MaxIBDevs)
	i, ok := l.MatchEntry("mlx5_0", 2)
	assert.True(t, ok)
	assert.Equal(t, Entry{"mlx5_0", 2, 0, 1}, l.Entries[i])
	i, ok = l.MatchEntry("mlx5_2", 1)
	assert.False(t, ok)
	assert.Equal(t, -1, i)
	ex, _ := ParseList("^mlx5_0", MaxIBDevs)
	i, ok = ex.MatchEntry("mlx5_1", 1)
	assert.True(t, ok)
	assert.Equal(t, -1, i, "an exclusion list has no entry for what it lets through")
	assert.Equal(t, "mlx5_0:1:0:0,mlx5_0:2:0:1,mlx5_1:1:1:0", l.String())
	assert.Equal(t, "^=a,b:1,c::2", List{Exclude: true, Exact: true, Entries: []Entry{e("a", -1), e("b", 1), {"c", -1, 2, -1}}}.String())
}

func TestAtoi(t *testing.T) {
	for in, want := range map[string]int{"12": 12, " 7": 7, "-3": -3, "+4": 4, "1x": 1, "x": 0, "": 0} {
		assert.Equal(t, want, atoi(in), in)
	}
}
