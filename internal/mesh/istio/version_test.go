package istio

import "testing"

func TestZtunnelIgnoresServiceEntryOfService(t *testing.T) {
	for version, want := range map[string]bool{
		"1.27.9":            false,
		"1.28.0":            false,
		"1.28.1":            true,
		"1.28.10":           true,
		"1.29.0-rc.1":       false, // a pre-release precedes 1.29.0; 1.28.1 is not on its line
		"1.29.0":            true,
		"v1.30.2":           true,
		"1.31.1-distroless": true,
		"2.0.0":             true,
	} {
		v, ok := ParseVersion(version)
		if !ok {
			t.Fatalf("ParseVersion(%q) failed", version)
		}
		if got := ZtunnelIgnoresServiceEntryOfService(v); got != want {
			t.Errorf("%s: %v, want %v", version, got, want)
		}
	}
	for _, bad := range []string{"", "latest", "1.29", "1.x.0", "master-2026-08-22T19-00-53"} {
		if _, ok := ParseVersion(bad); ok {
			t.Errorf("ParseVersion(%q) accepted an unknown version", bad)
		}
	}
}
