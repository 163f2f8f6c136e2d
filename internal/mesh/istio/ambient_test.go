package istio

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ambientInput: the three pods of input(), web-a and web-b enrolled in ambient mode.
func ambientInput() Input {
	in := input(slice("s", discoveryv1.AddressTypeIPv4,
		endpoint("web-a", "10.0.0.1", "z"), endpoint("web-b", "10.0.0.2", "z"), endpoint("web-c", "10.0.0.3", "z")))
	for _, name := range []string{"web-a", "web-b"} {
		in.Pods[name].Annotations = map[string]string{AmbientRedirectionAnnotation: AmbientRedirectionEnabled}
	}
	in.Namespace = &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{DataplaneModeLabel: "ambient"}}}
	in.Mesh.IstioVersion = "1.29.2"
	return in
}

func waypointBound(status metav1.ConditionStatus) func(*corev1.Service) {
	return func(s *corev1.Service) {
		s.Status.Conditions = []metav1.Condition{{Type: WaypointBoundCondition, Status: status, Reason: "Bound", Message: "bound to shop/waypoint"}}
	}
}

func TestEnforce(t *testing.T) {
	for name, tc := range map[string]struct {
		setup  func(*Input)
		want   EnforcementReason
		fixed  bool
		saying string
	}{
		"pods with sidecars only: clients with a sidecar apply the weights": {
			setup: func(in *Input) {
				for _, p := range in.Pods {
					p.Annotations = nil
				}
			},
			want: EnforcedBySidecars, fixed: true, saying: "no pod of Service web is in ambient mode"},
		"ambient pods without a waypoint: ztunnel clients are not weighted": {
			want: NotEnforcedAmbientWithoutWaypoint, saying: "2 of the Service's 3 mirrored pods are in ambient mode and no waypoint is bound to Service web: ztunnel clients balance without the weights"},
		"the Service's waypoint label, confirmed by istiod: weighted through the waypoint": {
			setup: func(in *Input) {
				in.Service.Labels = map[string]string{UseWaypointLabel: "waypoint"}
				waypointBound(metav1.ConditionTrue)(in.Service)
			},
			want: EnforcedByWaypoint, fixed: true, saying: "waypoint shop/waypoint is bound to Service web"},
		"the namespace's waypoint, confirmed by istiod": {
			setup: func(in *Input) {
				in.Namespace.Labels[UseWaypointLabel] = "ns-waypoint"
				waypointBound(metav1.ConditionTrue)(in.Service)
			},
			want: EnforcedByWaypoint, fixed: true, saying: "waypoint shop/ns-waypoint is bound"},
		"the Service opts out of its namespace's waypoint": {
			setup: func(in *Input) {
				in.Namespace.Labels[UseWaypointLabel] = "ns-waypoint"
				in.Service.Labels = map[string]string{UseWaypointLabel: "none"}
				waypointBound(metav1.ConditionTrue)(in.Service)
			},
			want: NotEnforcedAmbientWithoutWaypoint, saying: "its label istio.io/use-waypoint=none opts out"},
		"a waypoint in another namespace": {
			setup: func(in *Input) {
				in.Service.Labels = map[string]string{UseWaypointLabel: "shared", UseWaypointNamespaceLabel: "gateways"}
				waypointBound(metav1.ConditionTrue)(in.Service)
			},
			want: EnforcedByWaypoint, fixed: true, saying: "waypoint gateways/shared is bound"},
		"a waypoint label istiod reports unbound": {
			setup: func(in *Input) {
				in.Service.Labels = map[string]string{UseWaypointLabel: "waypoint"}
				waypointBound(metav1.ConditionFalse)(in.Service)
			},
			want: NotEnforcedAmbientWithoutWaypoint, saying: "istiod reports istio.io/WaypointBound=False"},
		"a waypoint label istiod has not confirmed": {
			setup: func(in *Input) { in.Service.Labels = map[string]string{UseWaypointLabel: "waypoint"} },
			want:  NotEnforcedAmbientWithoutWaypoint, saying: "istiod has not reported the Service's istio.io/WaypointBound condition"},
		"a pod's own waypoint label binds only traffic to the pod": {
			setup: func(in *Input) {
				for _, p := range in.Pods {
					p.Labels[UseWaypointLabel] = "waypoint"
				}
			},
			want: NotEnforcedAmbientWithoutWaypoint, saying: "no waypoint is bound to Service web"},
	} {
		t.Run(name, func(t *testing.T) {
			in := ambientInput()
			if tc.setup != nil {
				tc.setup(&in)
			}
			_, endpoints, err := Build(in)
			if err != nil {
				t.Fatal(err)
			}
			got := Enforce(in, endpoints)
			if got.Reason != tc.want || got.Enforced != tc.fixed || !strings.Contains(got.Message, tc.saying) {
				t.Fatalf("got %+v, want reason %s, enforced %v, saying %q", got, tc.want, tc.fixed, tc.saying)
			}
			if !got.Enforced && !strings.Contains(got.Message, "istio.io/use-waypoint") && !strings.Contains(got.Message, "istioctl waypoint") {
				t.Errorf("the message does not name the fix: %s", got.Message)
			}
		})
	}
}

func TestBuild_AmbientNeedsAnIstiodThatKeepsTheServiceEntryFromZtunnel(t *testing.T) {
	for name, tc := range map[string]struct {
		setup   func(*Input)
		refused string
	}{
		"ambient pods on istiod 1.29.2":  {},
		"ambient pods on istiod 1.28.1":  {setup: func(in *Input) { in.Mesh.IstioVersion = "1.28.1" }},
		"ambient pods on istiod 1.28.0":  {setup: func(in *Input) { in.Mesh.IstioVersion = "1.28.0" }, refused: "istiod is version 1.28.0"},
		"ambient pods, istiod unknown":   {setup: func(in *Input) { in.Mesh.IstioVersion = "" }, refused: "set the operator's --istio-version"},
		"ambient namespace, no pods yet": {setup: func(in *Input) { in.Mesh.IstioVersion = "1.27.3"; clearAmbientPods(in) }, refused: "namespace shop is labelled istio.io/dataplane-mode=ambient"},
		"sidecars only, old istiod": {setup: func(in *Input) {
			in.Mesh.IstioVersion = "1.24.0"
			clearAmbientPods(in)
			in.Namespace.Labels = nil
		}},
	} {
		t.Run(name, func(t *testing.T) {
			in := ambientInput()
			if tc.setup != nil {
				tc.setup(&in)
			}
			_, _, err := Build(in)
			switch {
			case tc.refused == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refused != "" && (!errors.Is(err, ErrAmbientIstioVersion) || !strings.Contains(err.Error(), tc.refused)):
				t.Fatalf("err = %v, want ErrAmbientIstioVersion saying %q", err, tc.refused)
			}
		})
	}
}

func clearAmbientPods(in *Input) {
	for _, p := range in.Pods {
		p.Annotations = nil
	}
}
