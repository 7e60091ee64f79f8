package metrics

import (
	"io"
	"testing"

	"github.com/prometheus/common/expfmt"

	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
)

// The per-message cost the plugin pays with metrics on. Each must report
// 0 allocs/op.

func BenchmarkRequestPosted(b *testing.B) {
	d := ForDevice("bench", "posted", 0)
	b.ReportAllocs()
	for b.Loop() {
		d.RequestPosted(Send)
	}
}

func BenchmarkRequestDone(b *testing.B) {
	d := ForDevice("bench", "done", 0)
	start := clock.Now()
	b.ReportAllocs()
	for b.Loop() {
		d.RequestDone(Send, 65536, start)
	}
}

// BenchmarkPostAndDone is what one request costs end to end: post, then
// completion with a latency observation.
func BenchmarkPostAndDone(b *testing.B) {
	d := ForDevice("bench", "postdone", 0)
	b.ReportAllocs()
	for b.Loop() {
		d.RequestPosted(Recv)
		d.RequestDone(Recv, 65536, clock.Now())
	}
}

// BenchmarkRequestDoneParallel has every P complete requests on one device:
// the worst case of contention (NCCL normally progresses a device from one
// proxy thread).
func BenchmarkRequestDoneParallel(b *testing.B) {
	d := ForDevice("bench", "parallel", 0)
	start := clock.Now()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			d.RequestDone(Send, 65536, start)
		}
	})
}

// BenchmarkScrape is the cost of one scrape of 8 devices, off the data path.
func BenchmarkScrape(b *testing.B) {
	devs := make([]*Device, 8)
	for i := range devs {
		devs[i] = ForDevice("bench", "scrape", i)
	}
	reg := newRegistry(Info{PluginVersion: "bench", APIVersion: "v10", Transport: "bench"}, 0, nil)
	b.ReportAllocs()
	for b.Loop() {
		mfs, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		for _, mf := range mfs {
			if _, err := expfmt.MetricFamilyToText(io.Discard, mf); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func BenchmarkNow(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		clock.Now()
	}
}
