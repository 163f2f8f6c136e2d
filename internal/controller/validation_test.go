package controller

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// Every rejection names the field, what was wrong and what is allowed, as the API server
// returns it to kubectl; none is a bare type conversion error.
func TestCRD_RejectsInvalidSpecsAtAdmission(t *testing.T) {
	f := newFixture(t)
	long := strings.Repeat("x", 4097)
	cases := map[string]struct {
		spec string // JSON merged over {"targetRef":{"name":"web"}}
		want string
	}{
		"interval that is not a duration":             {`{"interval":"soon"}`, "spec.interval: Invalid value: \"soon\": interval must be a duration between 5s and 10m written as a number and a unit, such as 30s, 2m or 1m30s; got soon"},
		"interval without a unit":                     {`{"interval":"30"}`, "interval must be a duration between 5s and 10m written as a number and a unit, such as 30s, 2m or 1m30s; got 30"},
		"interval too short":                          {`{"interval":"1s"}`, "interval must be a duration between 5s and 10m written as a number and a unit, such as 30s, 2m or 1m30s; got 1s"},
		"interval too long":                           {`{"interval":"20m"}`, "interval must be a duration between 5s and 10m"},
		"port 0":                                      {`{"ports":[80,0]}`, "spec.ports[1]: Invalid value: 0: spec.ports[1] in body should be greater than or equal to 1"},
		"port above 65535":                            {`{"ports":[70000]}`, "spec.ports[0]: Invalid value: 70000: spec.ports[0] in body should be less than or equal to 65535"},
		"minWeight below 1":                           {`{"minWeight":0}`, "spec.minWeight: Invalid value: 0: spec.minWeight in body should be greater than or equal to 1"},
		"maxWeight above the limit":                   {`{"maxWeight":2000000}`, "spec.maxWeight in body should be less than or equal to 1000000"},
		"minWeight above maxWeight":                   {`{"minWeight":500,"maxWeight":100}`, "minWeight must not exceed maxWeight: the smallest weight written must be at most the largest"},
		"unknown algorithm":                           {`{"algorithm":"fastest"}`, `spec.algorithm: Unsupported value: "fastest": supported values: "tail", "capacity", "cpu-distance"`},
		"unknown mode":                                {`{"mode":"Sometimes"}`, `spec.mode: Unsupported value: "Sometimes": supported values: "Active", "DryRun", "Frozen"`},
		"gain above 1":                                {`{"capacity":{"gain":"1.5"}}`, "spec.capacity.gain: Invalid value: \"1.5\": gain must be a decimal above 0 and at most 1, such as 0.5; got 1.5"},
		"gain that is not a number":                   {`{"capacity":{"gain":"five"}}`, "spec.capacity.gain: Invalid value: \"five\": gain must be a decimal above 0 and at most 1, such as 0.5; got five"},
		"negative deadBand":                           {`{"capacity":{"deadBand":"-0.1"}}`, "deadBand must be a decimal of at least 0 and below 1, such as 0.05; got -0.1"},
		"deadBand of 1":                               {`{"capacity":{"deadBand":"1"}}`, "deadBand must be a decimal of at least 0 and below 1, such as 0.05; got 1"},
		"maxStepRatio of 1":                           {`{"capacity":{"maxStepRatio":"1"}}`, "maxStepRatio must be a decimal greater than 1, such as 2; got 1"},
		"maxWeightRatio below 1":                      {`{"capacity":{"maxWeightRatio":"0.5"}}`, "maxWeightRatio must be a decimal of at least 1, such as 10; got 0.5"},
		"planningLoadFactor below 1":                  {`{"capacity":{"planningLoadFactor":"0.9"}}`, "planningLoadFactor must be a decimal of at least 1, such as 1.2; got 0.9"},
		"an overload ratio of 1":                      {`{"capacity":{"overloadLatencyRatio":"1"}}`, "overloadLatencyRatio must be a decimal greater than 1, such as 3, or 0 to turn overload detection off; got 1"},
		"minRequestRate not a number":                 {`{"capacity":{"minRequestRate":"1e3"}}`, "spec.capacity.minRequestRate: Invalid value: \"1e3\": minRequestRate must be a non-negative decimal number written as a string, such as 0.5; got 1e3"},
		"k of zero":                                   {`{"cpuDistance":{"k":"0"}}`, "k must be a decimal above 0 and at most 1, such as 0.5; got 0"},
		"cpu-distance deadBand of 2":                  {`{"cpuDistance":{"deadBand":"2"}}`, "spec.cpuDistance.deadBand: Invalid value: \"2\": deadBand must be a decimal of at least 0 and below 1"},
		"missing target":                              {`{"targetRef":null}`, "spec.targetRef: Required value"},
		"empty target name":                           {`{"targetRef":{"name":""}}`, "spec.targetRef.name in body should be at least 1 chars long"},
		"invalid target name":                         {`{"targetRef":{"name":"Web_Server"}}`, "targetRef.name must name a Service in this namespace: lowercase letters, digits and -, starting with a letter and ending with a letter or digit; got Web_Server"},
		"invalid exportTo":                            {`{"exportTo":["shop","Not A Namespace"]}`, "exportTo entries must be '.' (this namespace), '*' (every namespace), '~' (none) or a namespace name"},
		"query too long":                              {`{"metrics":{"queries":{"cpu":"` + long + `"}}}`, "spec.metrics.queries.cpu: Too long: may not be more than 4096 bytes"},
		"minWeight alone above the default maxWeight": {`{"minWeight":20000}`, "minWeight exceeds the algorithm's default maxWeight (tail: 10000, capacity: 1000, cpu-distance: 600); set maxWeight too"},
		"capacity minWeight alone above its default maxWeight":   {`{"algorithm":"capacity","minWeight":5000}`, "minWeight exceeds the algorithm's default maxWeight"},
		"capacity maxWeight alone below its default minWeight":   {`{"algorithm":"capacity","maxWeight":5}`, "maxWeight is below the algorithm's default minWeight (tail: 1, capacity: 10, cpu-distance: 100); set minWeight too"},
		"a tail quantile of 1":                                   {`{"tail":{"quantile":"1"}}`, "spec.tail.quantile: Invalid value: \"1\": quantile must be a decimal above 0.5 and below 1, such as 0.99; got 1"},
		"a tail utilization above the model's":                   {`{"tail":{"maxUtilization":"0.99"}}`, "maxUtilization must be a decimal above 0 and at most 0.95, such as 0.85; got 0.99"},
		"a tail burst margin below 1":                            {`{"tail":{"burstMargin":"0.5"}}`, "burstMargin must be a decimal of at least 1, such as 1.1; got 0.5"},
		"a tail share ratio that is not a number":                {`{"tail":{"maxShareRatio":"lots"}}`, "maxShareRatio must be a decimal of at least 1, such as 3; got lots"},
		"a surge factor below 1":                                 {`{"tail":{"surgeFactor":"0.5"}}`, "surgeFactor must be a decimal of at least 1, such as 4 (1 turns the surge bound off); got 0.5"},
		"a negative tail pod rate":                               {`{"tail":{"minPodRate":"-1"}}`, "minPodRate must be a non-negative decimal number written as a string, such as 1; got -1"},
		"maxWeight alone below cpu-distance's default minWeight": {`{"algorithm":"cpu-distance","maxWeight":50}`, "maxWeight is below the algorithm's default minWeight (tail: 1, capacity: 10, cpu-distance: 100); set minWeight too"},
		"minWeight alone above cpu-distance's default maxWeight": {`{"algorithm":"cpu-distance","minWeight":700}`, "minWeight exceeds the algorithm's default maxWeight"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			a := rawALB(t, f.ns, "bad", tc.spec)
			err := k8s.Create(f.ctx, a)
			if err == nil {
				_ = k8s.Delete(f.ctx, a)
				t.Fatal("the API server accepted an invalid spec")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q lacks %q", err.Error(), tc.want)
			}
			if strings.Contains(err.Error(), "conversion error") {
				t.Fatalf("error %q carries a type conversion error instead of what is allowed", err.Error())
			}
		})
	}

	// The allowed forms the messages name are accepted.
	for i, spec := range []string{
		`{"interval":"1m30s","ports":[1,80,65535],"exportTo":[".","*","~","shop-2"]}`,
		`{"interval":"5s","capacity":{"gain":"1","deadBand":"0","overloadLatencyRatio":"0","minRequestRate":"0.5"}}`,
		`{"interval":"10m","cpuDistance":{"k":"0.5","deadBand":"0.05"}}`,
		`{"tail":{"quantile":"0.999","maxUtilization":"0.95","burstMargin":"1","maxShareRatio":"1","surgeFactor":"1","minPodRate":"0"}}`,
		`{"minWeight":10000}`,
	} {
		if err := k8s.Create(f.ctx, rawALB(t, f.ns, fmt.Sprintf("allowed-%d", i), spec)); err != nil {
			t.Errorf("allowed spec %s rejected: %v", spec, err)
		}
	}

	// A valid spec is accepted and defaulted.
	dec := func(s string) *adlbv1.Decimal { d := adlbv1.Decimal(s); return &d }
	ok := &adlbv1.AdaptiveLoadBalancer{
		ObjectMeta: metav1.ObjectMeta{Name: "good", Namespace: f.ns},
		Spec: adlbv1.AdaptiveLoadBalancerSpec{TargetRef: adlbv1.TargetRef{Name: "web"},
			MinWeight: ptr.To[int32](5), MaxWeight: ptr.To[int32](500), Capacity: &adlbv1.CapacityParameters{Gain: dec("0.25")},
			Tail: &adlbv1.TailParameters{BurstMargin: dec("1.25"), MinPodRate: dec("2")}},
	}
	f.create(ok)
	if ok.Spec.Mode != adlbv1.ModeActive || ok.Spec.Algorithm != adlbv1.AlgorithmTail || ok.Spec.Interval == nil || ok.Spec.Interval.Duration != 30e9 {
		t.Fatalf("defaults: mode %q algorithm %q interval %v", ok.Spec.Mode, ok.Spec.Algorithm, ok.Spec.Interval)
	}
	s, err := EngineSettings(ok)
	if err != nil || s.MinWeight != 5 || s.MaxWeight != 500 || s.Capacity.Gain != 0.25 || s.Tail.BurstMargin != 1.25 || s.Tail.MinPodRate != 2 || s.Tail.Quantile != 0.99 {
		t.Fatalf("engine settings %+v err %v", s, err)
	}
	// Every single bound admission accepts gives settings the engine accepts: none passes
	// admission only to be skipped by the weight cycle.
	for name, spec := range map[string]adlbv1.AdaptiveLoadBalancerSpec{
		"minWeight 1000 alone":                {MinWeight: ptr.To[int32](1000)},
		"maxWeight 10 alone":                  {MaxWeight: ptr.To[int32](10)},
		"cpu-distance minWeight 600 alone":    {Algorithm: adlbv1.AlgorithmCPUDistance, MinWeight: ptr.To[int32](600)},
		"cpu-distance maxWeight 100 alone":    {Algorithm: adlbv1.AlgorithmCPUDistance, MaxWeight: ptr.To[int32](100)},
		"both bounds far from the defaults":   {MinWeight: ptr.To[int32](5000), MaxWeight: ptr.To[int32](90000)},
		"cpu-distance with both bounds small": {Algorithm: adlbv1.AlgorithmCPUDistance, MinWeight: ptr.To[int32](5), MaxWeight: ptr.To[int32](50)},
	} {
		spec.TargetRef = adlbv1.TargetRef{Name: "web"}
		a := &adlbv1.AdaptiveLoadBalancer{ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: f.ns}, Spec: spec}
		if err := k8s.Create(f.ctx, a); err != nil {
			t.Fatalf("%s: rejected at admission: %v", name, err)
		}
		if _, err := EngineSettings(a); err != nil {
			t.Errorf("%s: admitted, but the engine refuses it: %v", name, err)
		}
		if err := k8s.Delete(f.ctx, a); err != nil {
			t.Fatal(err)
		}
	}
}

// rawALB builds an AdaptiveLoadBalancer from JSON, so a test can send what the typed client
// cannot express (a duration that does not parse, a null field).
func rawALB(t *testing.T, ns, name, specJSON string) *unstructured.Unstructured {
	t.Helper()
	spec := map[string]any{"targetRef": map[string]any{"name": "web"}}
	patch := map[string]any{}
	if err := json.Unmarshal([]byte(specJSON), &patch); err != nil {
		t.Fatal(err)
	}
	for k, v := range patch {
		if v == nil {
			delete(spec, k)
			continue
		}
		spec[k] = v
	}
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetGroupVersionKind(adlbv1.GroupVersion.WithKind("AdaptiveLoadBalancer"))
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}
