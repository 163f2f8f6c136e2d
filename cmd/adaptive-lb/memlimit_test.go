package main

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestSetMemoryLimitFromCgroup(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1)) // restore whatever was set
	dir := t.TempDir()
	write := func(content string) string {
		p := filepath.Join(dir, "memory.max")
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Setenv("GOMEMLIMIT", "")
	if got := setMemoryLimitFromCgroup(write("2147483648\n")); got != 1932735283 || debug.SetMemoryLimit(-1) != got {
		t.Errorf("a 2 GiB container: soft limit %d, runtime has %d; want 90%%", got, debug.SetMemoryLimit(-1))
	}
	debug.SetMemoryLimit(math.MaxInt64)
	if got := setMemoryLimitFromCgroup(write("max\n")); got != 0 || debug.SetMemoryLimit(-1) != math.MaxInt64 {
		t.Errorf("an unlimited container got a soft limit %d", got)
	}
	if got := setMemoryLimitFromCgroup(filepath.Join(dir, "absent")); got != 0 {
		t.Errorf("no cgroup file: soft limit %d", got)
	}
	t.Setenv("GOMEMLIMIT", "1GiB")
	if got := setMemoryLimitFromCgroup(write("2147483648\n")); got != 0 {
		t.Errorf("GOMEMLIMIT set by the user was overridden: %d", got)
	}
}
