package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Mode says whether the operator writes weights.
// +kubebuilder:validation:Enum=Active;DryRun;Frozen
type Mode string

const (
	// ModeActive mirrors the endpoints and writes computed weights.
	ModeActive Mode = "Active"
	// ModeDryRun mirrors the endpoints with equal weights and only publishes the weights it would
	// write, in status and metrics.
	ModeDryRun Mode = "DryRun"
	// ModeFrozen keeps mirroring the endpoints at the weights the ServiceEntry carries now and
	// stops changing them: no metrics are fetched and no weight is written. A pod that joins
	// gets the median weight of its instance type's pods, as in Active. Unlike DryRun, it does
	// not reset the weights to equal. Setting Active again resumes the weight cycle.
	ModeFrozen Mode = "Frozen"
)

// Algorithm names a weight algorithm.
// +kubebuilder:validation:Enum=tail;capacity;cpu-distance
type Algorithm string

const (
	AlgorithmTail        Algorithm = "tail"
	AlgorithmCapacity    Algorithm = "capacity"
	AlgorithmCPUDistance Algorithm = "cpu-distance"
)

// AdaptiveLoadBalancerSpec opts one Service into adaptive endpoint weights.
// +kubebuilder:validation:XValidation:rule="!has(self.minWeight) || !has(self.maxWeight) || self.minWeight <= self.maxWeight",message="minWeight must not exceed maxWeight: the smallest weight written must be at most the largest"
// A bound set alone must still fit the algorithm's default for the other one (capacity: 10..1000,
// cpu-distance: 100..600); otherwise the engine could never run and weights would stay equal.
// +kubebuilder:validation:XValidation:rule="!has(self.minWeight) || has(self.maxWeight) || self.minWeight <= ((has(self.algorithm) && self.algorithm == 'cpu-distance') ? 600 : (has(self.algorithm) && self.algorithm == 'capacity') ? 1000 : 10000)",message="minWeight exceeds the algorithm's default maxWeight (tail: 10000, capacity: 1000, cpu-distance: 600); set maxWeight too"
// +kubebuilder:validation:XValidation:rule="!has(self.maxWeight) || has(self.minWeight) || self.maxWeight >= ((has(self.algorithm) && self.algorithm == 'cpu-distance') ? 100 : (has(self.algorithm) && self.algorithm == 'capacity') ? 10 : 1)",message="maxWeight is below the algorithm's default minWeight (tail: 1, capacity: 10, cpu-distance: 100); set minWeight too"
type AdaptiveLoadBalancerSpec struct {
	// TargetRef names the Service, in the same namespace, whose endpoints get weights. It cannot
	// change: the ServiceEntry of the old Service would otherwise outlive the change. To weight
	// another Service, create another AdaptiveLoadBalancer.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="targetRef is immutable: create a new AdaptiveLoadBalancer for the other Service and delete this one"
	TargetRef TargetRef `json:"targetRef"`

	// Ports selects Service ports by number; empty means every port of the Service.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=65535
	Ports []int32 `json:"ports,omitempty"`

	// Mode is Active (write weights), DryRun (equal weights in the ServiceEntry; compute and
	// publish the adaptive ones only) or Frozen (keep the current weights, change none).
	// +optional
	// +kubebuilder:default=Active
	Mode Mode `json:"mode,omitempty"`

	// Algorithm computes the weights.
	// +optional
	// +kubebuilder:default=tail
	Algorithm Algorithm `json:"algorithm,omitempty"`

	// (The rule checks the format before calling duration(), which on anything else fails with a
	// type conversion error that names neither the field nor the allowed form.)

	// Interval between weight cycles for this Service; a multiple of the operator's cycle tick.
	// +optional
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('5s') && duration(self) <= duration('10m')",messageExpression="'interval must be a duration between 5s and 10m written as a number and a unit, such as 30s, 2m or 1m30s; got ' + self"
	Interval *metav1.Duration `json:"interval,omitempty"`

	// MinWeight is the smallest weight written (Envoy ignores weight 0).
	// +optional
	// +kubebuilder:validation:Minimum=1
	MinWeight *int32 `json:"minWeight,omitempty"`

	// MaxWeight is the largest weight written.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	MaxWeight *int32 `json:"maxWeight,omitempty"`

	// Capacity tunes the capacity algorithm, and the feedback toward the target shares that the
	// tail algorithm shares with it.
	// +optional
	Capacity *CapacityParameters `json:"capacity,omitempty"`

	// Tail tunes how the tail algorithm chooses its target shares.
	// +optional
	Tail *TailParameters `json:"tail,omitempty"`

	// CPUDistance tunes the cpu-distance algorithm.
	// +optional
	CPUDistance *CPUDistanceParameters `json:"cpuDistance,omitempty"`

	// Metrics overrides how this Service's signals are queried.
	// +optional
	Metrics *MetricsSpec `json:"metrics,omitempty"`

	// ExportTo limits the namespaces the generated ServiceEntry is visible to, as in Istio's
	// ServiceEntry.exportTo ("." for this namespace, "*" for all). Empty exports it like the Service.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.all(x, x in ['.', '*', '~'] || x.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'))",message="exportTo entries must be '.' (this namespace), '*' (every namespace), '~' (none) or a namespace name"
	ExportTo []string `json:"exportTo,omitempty"`
}

// TargetRef names a Service in the same namespace.
type TargetRef struct {
	// Name of the Service.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",messageExpression="'targetRef.name must name a Service in this namespace: lowercase letters, digits and -, starting with a letter and ending with a letter or digit; got ' + self"
	Name string `json:"name"`
}

// Each spec field's rule checks a Decimal's format before double(), which on anything else fails
// with a type conversion error that names neither the field nor the allowed form.

// Decimal is a decimal number written as a string, such as "0.5".
// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?$`
// +kubebuilder:validation:MaxLength=16
type Decimal string

// CapacityParameters tune the capacity algorithm; unset fields take the operator's defaults.
type CapacityParameters struct {
	// Gain is the fraction of the way toward the target shares taken per cycle, in (0, 1].
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && (double(self) > 0.0 && double(self) <= 1.0)",messageExpression="'gain must be a decimal above 0 and at most 1, such as 0.5; got ' + self"
	Gain *Decimal `json:"gain,omitempty"`
	// MaxStepRatio bounds one cycle's change of a weight to [w/r, w*r]; greater than 1.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && double(self) > 1.0",messageExpression="'maxStepRatio must be a decimal greater than 1, such as 2; got ' + self"
	MaxStepRatio *Decimal `json:"maxStepRatio,omitempty"`
	// MaxWeightRatio bounds the largest weight over the smallest; at least 1.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && double(self) >= 1.0",messageExpression="'maxWeightRatio must be a decimal of at least 1, such as 10; got ' + self"
	MaxWeightRatio *Decimal `json:"maxWeightRatio,omitempty"`
	// DeadBand is the relative change below which nothing is written, in [0, 1).
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && double(self) < 1.0",messageExpression="'deadBand must be a decimal of at least 0 and below 1, such as 0.05; got ' + self"
	DeadBand *Decimal `json:"deadBand,omitempty"`
	// MinRequestRate is the request rate (per second) below which a pod's cost is not trusted.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$')",messageExpression="'minRequestRate must be a non-negative decimal number written as a string, such as 0.5; got ' + self"
	MinRequestRate *Decimal `json:"minRequestRate,omitempty"`
	// PlanningLoadFactor splits traffic as if the load were this many times the observed one; at least 1.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && double(self) >= 1.0",messageExpression="'planningLoadFactor must be a decimal of at least 1, such as 1.2; got ' + self"
	PlanningLoadFactor *Decimal `json:"planningLoadFactor,omitempty"`
	// OverloadLatencyRatio halves at once the weight of a pod whose p99 latency, in units of its
	// own CPU cost per request, exceeds this multiple of the median pod's; greater than 1, or 0
	// to turn overload detection off. It needs the latencyP99 signal.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && (double(self) == 0.0 || double(self) > 1.0)",messageExpression="'overloadLatencyRatio must be a decimal greater than 1, such as 3, or 0 to turn overload detection off; got ' + self"
	OverloadLatencyRatio *Decimal `json:"overloadLatencyRatio,omitempty"`
}

// TailParameters tune the tail algorithm's split; unset fields take the operator's defaults.
type TailParameters struct {
	// Quantile is the latency quantile the split minimises, in (0.5, 1); default 0.99.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && double(self) > 0.5 && double(self) < 1.0",messageExpression="'quantile must be a decimal above 0.5 and below 1, such as 0.99; got ' + self"
	Quantile *Decimal `json:"quantile,omitempty"`
	// MaxUtilization is the highest load planned for a pod, as a fraction of its CPU limit, in
	// (0, 0.95]; it gives way when the whole fleet is planned above it. Default 0.85.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && double(self) > 0.0 && double(self) <= 0.95",messageExpression="'maxUtilization must be a decimal above 0 and at most 0.95, such as 0.85; got ' + self"
	MaxUtilization *Decimal `json:"maxUtilization,omitempty"`
	// BurstMargin multiplies the planning load (the larger of the current and the recent peak
	// request rate); at least 1. Default 1.1.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && double(self) >= 1.0",messageExpression="'burstMargin must be a decimal of at least 1, such as 1.1; got ' + self"
	BurstMargin *Decimal `json:"burstMargin,omitempty"`
	// MaxShareRatio bounds a group's share to this multiple of its share of the fleet's
	// capacity; at least 1. Default 3.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && double(self) >= 1.0",messageExpression="'maxShareRatio must be a decimal of at least 1, such as 3; got ' + self"
	MaxShareRatio *Decimal `json:"maxShareRatio,omitempty"`
	// SurgeFactor is the rise of the load, over the planning load, that the split must carry
	// without loading any group beyond its CPU limit before the operator has measured it (a
	// window and the TSDB's lag later). It narrows the split at low load, where it would
	// otherwise lean hardest on the fastest pods. At least 1; 1 turns the bound off and trades
	// robustness to sudden load for a lower tail at steady low load. Default 4.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && double(self) >= 1.0",messageExpression="'surgeFactor must be a decimal of at least 1, such as 4 (1 turns the surge bound off); got ' + self"
	SurgeFactor *Decimal `json:"surgeFactor,omitempty"`
	// MinPodRate is the request rate (per second) every pod keeps so that it stays measurable.
	// Default 1.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$')",messageExpression="'minPodRate must be a non-negative decimal number written as a string, such as 1; got ' + self"
	MinPodRate *Decimal `json:"minPodRate,omitempty"`
}

// CPUDistanceParameters tune the cpu-distance algorithm (the published operator's).
type CPUDistanceParameters struct {
	// K scales the relative CPU distance into a weight change, in (0, 1].
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && (double(self) > 0.0 && double(self) <= 1.0)",messageExpression="'k must be a decimal above 0 and at most 1, such as 0.5; got ' + self"
	K *Decimal `json:"k,omitempty"`
	// DeadBand is the relative CPU distance below which a weight is left alone, in [0, 1).
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+)?$') && double(self) < 1.0",messageExpression="'deadBand must be a decimal of at least 0 and below 1, such as 0.05; got ' + self"
	DeadBand *Decimal `json:"deadBand,omitempty"`
}

// MetricsSpec overrides the operator's metric queries for this Service.
type MetricsSpec struct {
	// Queries are Go text/template PromQL templates, one per signal; unset ones use the
	// operator's. See docs/metrics.md for the template data.
	// +optional
	Queries *QueryOverrides `json:"queries,omitempty"`
}

// QueryOverrides holds one PromQL template per signal.
type QueryOverrides struct {
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	CPU string `json:"cpu,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	RequestRate string `json:"requestRate,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	ErrorRate string `json:"errorRate,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	LatencyP99 string `json:"latencyP99,omitempty"`
}

// AdaptiveLoadBalancerStatus is what the operator observed and did.
type AdaptiveLoadBalancerStatus struct {
	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, EndpointsMirrored, MetricsAvailable, WeightsApplied and WeightsEnforced.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ServiceEntry is the name of the ServiceEntry the operator owns for this Service: its first
	// slice, named as the Service. A Service with more endpoints than one slice holds (100) has
	// further slices named <serviceEntry>.1, <serviceEntry>.2 and so on, all of the same host.
	// +optional
	ServiceEntry string `json:"serviceEntry,omitempty"`

	// ServiceEntrySlices is the number of ServiceEntries the endpoints are split across.
	// +optional
	ServiceEntrySlices int32 `json:"serviceEntrySlices,omitempty"`

	// EndpointCount is the number of endpoints mirrored into the ServiceEntry.
	// +optional
	EndpointCount int32 `json:"endpointCount,omitempty"`

	// Endpoints lists the mirrored endpoints and their weights, at most MaxStatusEndpoints.
	// +optional
	// +listType=atomic
	Endpoints []EndpointStatus `json:"endpoints,omitempty"`

	// EndpointsTruncated is true when more endpoints exist than Endpoints lists.
	// +optional
	EndpointsTruncated bool `json:"endpointsTruncated,omitempty"`

	// LastWeightWrite is when weights were last written to the ServiceEntry.
	// +optional
	LastWeightWrite *metav1.Time `json:"lastWeightWrite,omitempty"`

	// RecentPeak is the highest total request rate of the Service's pods that the weight cycle
	// saw in the last 10 minutes, which the tail algorithm plans for, and when it saw it. A new
	// leader continues from it instead of planning for its first cycle's rate alone.
	// +optional
	RecentPeak *RecentPeak `json:"recentPeak,omitempty"`

	// ModelCheck is the tail algorithm's check of its latency model against what the next
	// windows measured: how far it distrusts the model now, and when and why measurements
	// last overruled it. A new leader continues from it. Absent while the model was never
	// distrusted.
	// +optional
	ModelCheck *ModelCheck `json:"modelCheck,omitempty"`

	// LastRelief is the last check between cycles that cut a pod's weight at once, because its
	// latency or CPU jumped since the last cycle (algorithms capacity and tail). Absent until
	// the first relief.
	// +optional
	LastRelief *Relief `json:"lastRelief,omitempty"`

	// SurgeBound is the tail algorithm's surge bound in force for this Service, and why: set in
	// spec.tail.surgeFactor, learned from the Service's own load history in the TSDB, or the
	// default. Absent for the other algorithms.
	// +optional
	SurgeBound *SurgeBound `json:"surgeBound,omitempty"`
}

// Relief is one write of the check between cycles.
type Relief struct {
	// Time is when the relief's weights were written.
	Time metav1.Time `json:"time"`
	// Reason names the pods relieved and the evidence: their latency, CPU or CPU per request
	// now and at the last cycle.
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason"`
}

// SurgeBound is the rise of the load over the planning load that the tail algorithm's split
// must carry without loading any pod group beyond its CPU limit before the next cycle has
// measured it.
type SurgeBound struct {
	// Factor is the bound: 1 is none (the model's split), 4 the default.
	Factor Decimal `json:"factor"`
	// Reason says where the bound comes from and what the history showed.
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason"`
	// MaxRise is the largest rise of the Service's load, within the loop's reaction time, above
	// the recent peak it had held, in the history the bound was learned from.
	// +optional
	MaxRise *Decimal `json:"maxRise,omitempty"`
	// LearnedAt is when the history was last read.
	// +optional
	LearnedAt *metav1.Time `json:"learnedAt,omitempty"`
	// HistorySeconds is the span of history the bound was learned from, in seconds.
	// +optional
	HistorySeconds *int64 `json:"historySeconds,omitempty"`
}

// ModelCheck is the tail algorithm's standing with what it measured.
type ModelCheck struct {
	// Distrust is from 0 to 1: 0 follows the split the model predicts the lowest p99 for, 1 the
	// capacity algorithm's split, which needs no latency model. It rises when a window shows a
	// group the weights loaded to its CPU limit with its latency risen, or a tail the model
	// cannot explain, and falls by a quarter per window that agrees with the model.
	Distrust Decimal `json:"distrust"`
	// LastOverrule is when measurements last overruled the model and moved the weights toward
	// the capacity split.
	// +optional
	LastOverrule *metav1.Time `json:"lastOverrule,omitempty"`
	// LastOverruleReason says which pod group disagreed with the model, and how.
	// +optional
	LastOverruleReason string `json:"lastOverruleReason,omitempty"`
}

// RecentPeak is one observation of a Service's total request rate.
type RecentPeak struct {
	// RequestRate is in requests per second, summed over the Service's pods.
	RequestRate Decimal `json:"requestRate"`
	// ObservedAt is the weight cycle that observed it.
	ObservedAt metav1.Time `json:"observedAt"`
}

// MaxStatusEndpoints bounds the endpoint list in status so the object stays small.
const MaxStatusEndpoints = 500

// EndpointStatus is one mirrored endpoint.
type EndpointStatus struct {
	Pod  string `json:"pod"`
	IP   string `json:"ip"`
	Zone string `json:"zone,omitempty"`
	// Weight is the weight in the ServiceEntry (or, in DryRun, the one that would be written).
	Weight int32 `json:"weight"`
	// Reason explains the weight, e.g. "no metrics: median weight".
	// +optional
	Reason string `json:"reason,omitempty"`
	// CPUCores and RequestRate are the signals the weight cycle saw for this endpoint when it
	// last wrote the status: they are refreshed whenever a weight, a reason or a condition
	// changes, and otherwise at most every 5 minutes (to spare the API server); the live
	// values are in the TSDB. Empty when the pod had no usable signal.
	// +optional
	CPUCores Decimal `json:"cpuCores,omitempty"`
	// +optional
	RequestRate Decimal `json:"requestRate,omitempty"`
	// LastChange is when this endpoint's weight last changed.
	// +optional
	LastChange *metav1.Time `json:"lastChange,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=adlb,categories=adaptivelb
// +kubebuilder:printcolumn:name="Target",type=string,JSONPath=`.spec.targetRef.name`
// +kubebuilder:printcolumn:name="Endpoints",type=integer,JSONPath=`.status.endpointCount`
// +kubebuilder:printcolumn:name="Slices",type=integer,JSONPath=`.status.serviceEntrySlices`,priority=1
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// AdaptiveLoadBalancer opts a Service into capacity-aware Envoy endpoint weights, written
// through an Istio ServiceEntry that mirrors the Service's ready endpoints.
type AdaptiveLoadBalancer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AdaptiveLoadBalancerSpec   `json:"spec,omitempty"`
	Status AdaptiveLoadBalancerStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// AdaptiveLoadBalancerList is a list of AdaptiveLoadBalancers.
type AdaptiveLoadBalancerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AdaptiveLoadBalancer `json:"items"`
}

func init() {
	SchemeBuilder.Register(&AdaptiveLoadBalancer{}, &AdaptiveLoadBalancerList{})
}
