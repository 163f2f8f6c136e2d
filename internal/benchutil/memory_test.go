package benchutil

import (
	"os"
	"runtime"
	"testing"
)

func TestPeakHeapSeesWhatTheWorkHolds(t *testing.T) {
	var keep [][]byte
	peak, _ := PeakHeap(func() {
		for range 64 {
			keep = append(keep, make([]byte, 1<<20)) // 64 MiB held until the work ends
		}
	})
	runtime.KeepAlive(keep)
	if peak < 32<<20 {
		t.Errorf("peak %d bytes above the start, want at least 32 MiB of the 64 MiB held", peak)
	}
}

func TestProcessMemoryReadsThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc here")
	}
	if rss, hwm := ProcessMemory("self"); rss == 0 || hwm < rss {
		t.Errorf("rss %d, peak %d: want a resident set and a peak at least as large", rss, hwm)
	}
}

func TestProcessAnonymousMemoryIsPartOfTheResidentSet(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc here")
	}
	anon := ProcessAnonymousMemory("self")
	if rss, _ := ProcessMemory("self"); anon == 0 || anon > rss {
		t.Errorf("anonymous %d bytes, resident set %d: want some, within the resident set", anon, rss)
	}
}
