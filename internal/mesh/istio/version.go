package istio

import (
	"cmp"
	"strconv"
	"strings"
)

// Version is an Istio release: major.minor.patch, and whether it is a pre-release of it
// (1.29.0-rc.1), which sorts before the release.
type Version struct {
	Major, Minor, Patch int
	PreRelease          bool
}

// ParseVersion reads an Istio version as istiod's Deployment labels carry it ("1.29.2",
// "v1.29.2", "1.30.0-beta.1", or an image tag with a variant, "1.29.2-distroless"). It reports
// false for anything else (a development build, "latest").
func ParseVersion(s string) (Version, bool) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	core, suffix, hasSuffix := strings.Cut(s, "-")
	parts := strings.Split(core, ".")
	if len(parts) != 3 {
		return Version{}, false
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 {
			return Version{}, false
		}
		n[i] = v
	}
	v := Version{Major: n[0], Minor: n[1], Patch: n[2]}
	// Variants of a release image (distroless, debug) are the release; anything else after the
	// "-" (alpha, beta, rc) precedes it.
	v.PreRelease = hasSuffix && suffix != "distroless" && suffix != "debug"
	return v, true
}

// Compare orders versions: negative when v precedes o.
func (v Version) Compare(o Version) int {
	if c := cmp.Or(cmp.Compare(v.Major, o.Major), cmp.Compare(v.Minor, o.Minor), cmp.Compare(v.Patch, o.Patch)); c != 0 {
		return c
	}
	switch {
	case v.PreRelease == o.PreRelease:
		return 0
	case v.PreRelease:
		return -1
	}
	return 1
}

func (v Version) String() string {
	out := strconv.Itoa(v.Major) + "." + strconv.Itoa(v.Minor) + "." + strconv.Itoa(v.Patch)
	if v.PreRelease {
		out += "-pre"
	}
	return out
}

// ztunnelDedupSince are the first releases of each line whose istiod keeps a ServiceEntry out of
// ztunnel's workload discovery when a Kubernetes Service has the same host: istio/istio#57782
// ("dedupe ServiceEntry with overlapping hosts"), released in 1.29.0 and backported to 1.28.1
// (#58118). Before, ztunnel received the ServiceEntry as a service of the same host beside the
// Service's (one overwriting the other in istiod's index) and a second workload for every pod
// address, without tunnel or identity.
var ztunnelDedupSince = []Version{{Major: 1, Minor: 28, Patch: 1}, {Major: 1, Minor: 29}}

// ZtunnelIgnoresServiceEntryOfService reports whether istiod at version v leaves a ServiceEntry
// whose host is a Kubernetes Service's out of ztunnel's workload discovery.
func ZtunnelIgnoresServiceEntryOfService(v Version) bool {
	first := ztunnelDedupSince[len(ztunnelDedupSince)-1]
	if v.Compare(first) >= 0 {
		return true
	}
	for _, since := range ztunnelDedupSince {
		if v.Major == since.Major && v.Minor == since.Minor && v.Compare(since) >= 0 {
			return true
		}
	}
	return false
}
