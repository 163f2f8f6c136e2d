package metrics

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestDecodeQueryResponse(t *testing.T) {
	customLabels := Labels{Namespace: "kubernetes_namespace", Pod: "kubernetes_pod_name"}
	cases := map[string]struct {
		body   string
		labels Labels
		// For a successful decode:
		status, resultType string
		series             int
		values             map[podKey]float64 // checked with valueSample; NaN/Inf expect ErrNonFinite
		duplicates         []podKey
		unlabelled         int
		warnings           []string
		errorType, errText string
		// For a failed decode:
		wantErr error
	}{
		"a plain vector": {
			body:   `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"namespace":"shop","pod":"api-1"},"value":[1795348200,"0.5"]},{"metric":{"namespace":"shop","pod":"api-2"},"value":[1795348200.123,"2"]}]}}`,
			status: "success", resultType: "vector", series: 2,
			values: map[podKey]float64{{"shop", "api-1"}: 0.5, {"shop", "api-2"}: 2},
		},
		"label, field and envelope order do not matter": {
			body:   `{"data":{"result":[{"value":[1795348200,"7"],"metric":{"pod":"api-1","job":"x","namespace":"shop"}}],"resultType":"vector"},"status":"success"}`,
			status: "success", resultType: "vector", series: 1,
			values: map[podKey]float64{{"shop", "api-1"}: 7},
		},
		"escaped strings in label values are unescaped": {
			body:   `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"namespace":"sh\"op\\","pod":"caf\u00e9-\n1"},"value":[1,"1"]}]}}`,
			status: "success", resultType: "vector", series: 1,
			values: map[podKey]float64{{"sh\"op\\", "café-\n1"}: 1},
		},
		"configured label names are used, the defaults are then ordinary labels": {
			body:   `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"namespace":"wrong","pod":"wrong","kubernetes_namespace":"shop","kubernetes_pod_name":"api-1"},"value":[1,"3"]}]}}`,
			labels: customLabels, status: "success", resultType: "vector", series: 1,
			values: map[podKey]float64{{"shop", "api-1"}: 3},
		},
		"huge, tiny and exponent numbers parse; out of range becomes Inf and is rejected per pod": {
			body: `{"status":"success","data":{"resultType":"vector","result":[` +
				`{"metric":{"namespace":"n","pod":"big"},"value":[1e20,"1.7976931348623157e308"]},` +
				`{"metric":{"namespace":"n","pod":"tiny"},"value":[1,"4.9e-324"]},` +
				`{"metric":{"namespace":"n","pod":"over"},"value":[1,"1e400"]},` +
				`{"metric":{"namespace":"n","pod":"ts"},"value":[1795348200,"1795348195.5"]}]}}`,
			status: "success", resultType: "vector", series: 4,
			values: map[podKey]float64{
				{"n", "big"}: math.MaxFloat64, {"n", "tiny"}: 5e-324, {"n", "over"}: math.Inf(1), {"n", "ts"}: 1795348195.5,
			},
		},
		"NaN and ±Inf strings decode and are rejected per pod, not per query": {
			body: `{"status":"success","data":{"resultType":"vector","result":[` +
				`{"metric":{"namespace":"n","pod":"nan"},"value":[1,"NaN"]},` +
				`{"metric":{"namespace":"n","pod":"pinf"},"value":[1,"+Inf"]},` +
				`{"metric":{"namespace":"n","pod":"ninf"},"value":[1,"-Inf"]},` +
				`{"metric":{"namespace":"n","pod":"ok"},"value":[1,"1"]}]}}`,
			status: "success", resultType: "vector", series: 4,
			values: map[podKey]float64{{"n", "nan"}: math.NaN(), {"n", "pinf"}: math.Inf(1), {"n", "ninf"}: math.Inf(-1), {"n", "ok"}: 1},
		},
		"unknown fields at every level are skipped": {
			body: `{"status":"success","isPartial":false,"stats":{"seriesFetched":"2","deep":[{"a":[1,{"b":null}]}]},` +
				`"data":{"resultType":"vector","stats":{"x":1},"result":[{"metric":{"namespace":"n","pod":"p"},"histogram":[1,{"count":"2"}],"value":[1,"4"],"extra":true}]},"infos":["i"]}`,
			status: "success", resultType: "vector", series: 1,
			values: map[podKey]float64{{"n", "p"}: 4},
		},
		"an empty result": {
			body:   `{"status":"success","data":{"resultType":"vector","result":[]}}`,
			status: "success", resultType: "vector",
		},
		"two series for one pod are a duplicate, whatever their order": {
			body: `{"status":"success","data":{"resultType":"vector","result":[` +
				`{"metric":{"namespace":"n","pod":"p","instance":"a"},"value":[1,"1"]},` +
				`{"metric":{"pod":"p","namespace":"n","instance":"b"},"value":[1,"2"]},` +
				`{"metric":{"namespace":"n","pod":"p"},"value":[1,"3"]},` +
				`{"metric":{"namespace":"n","pod":"q"},"value":[1,"5"]}]}}`,
			status: "success", resultType: "vector", series: 4,
			values:     map[podKey]float64{{"n", "q"}: 5},
			duplicates: []podKey{{"n", "p"}},
		},
		"series without the pod labels are counted, not attributed": {
			body:   `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"job":"x"},"value":[1,"1"]},{"metric":{"namespace":"n","pod":""},"value":[1,"1"]}]}}`,
			status: "success", resultType: "vector", series: 2, unlabelled: 2,
		},
		"warnings are returned with the result": {
			body:   `{"status":"success","warnings":["store eu-1 unavailable","slow"],"data":{"resultType":"vector","result":[]}}`,
			status: "success", resultType: "vector", warnings: []string{"store eu-1 unavailable", "slow"},
		},
		"a matrix is reported by type and its result is not decoded": {
			body:   `{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"1"]]}]}}`,
			status: "success", resultType: "matrix",
		},
		"a scalar whose result comes before its type": {
			body:   `{"status":"success","data":{"result":[1,"1"],"resultType":"scalar"}}`,
			status: "success", resultType: "scalar",
		},
		"an error body": {
			body:   `{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected \"}\""}`,
			status: "error", errorType: "bad_data", errText: `1:5: parse error: unexpected "}"`,
		},
		"a success body without data": {
			body: `{"status":"success"}`, status: "success",
		},
		"a null data": {
			body: `{"status":"success","data":null}`, status: "success",
		},

		"truncated JSON":                 {body: `{"status":"success","data":{"resultType":"vector","result":[{"metric":`, wantErr: ErrMalformedResponse},
		"not JSON":                       {body: `<html>login</html>`, wantErr: ErrMalformedResponse},
		"empty body":                     {body: ``, wantErr: ErrMalformedResponse},
		"JSON without a status":          {body: `{"data":{"resultType":"vector","result":[]}}`, wantErr: ErrMalformedResponse},
		"a number as the value string":   {body: `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"namespace":"n","pod":"p"},"value":[1,0.5]}]}}`, wantErr: ErrMalformedResponse},
		"an unparsable value":            {body: `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"namespace":"n","pod":"p"},"value":[1,"fast"]}]}}`, wantErr: ErrMalformedResponse},
		"a sample pair of one element":   {body: `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"namespace":"n","pod":"p"},"value":[1]}]}}`, wantErr: ErrMalformedResponse},
		"a sample pair of three":         {body: `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"namespace":"n","pod":"p"},"value":[1,"1","2"]}]}}`, wantErr: ErrMalformedResponse},
		"a series without a value":       {body: `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"namespace":"n","pod":"p"}}]}}`, wantErr: ErrMalformedResponse},
		"a label value that is a number": {body: `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"namespace":"n","pod":7},"value":[1,"1"]}]}}`, wantErr: ErrMalformedResponse},
		"trailing garbage inside data":   {body: `{"status":"success","data":{"resultType":"vector","result":[]},}`, wantErr: ErrMalformedResponse},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			labels := DefaultLabels
			if tc.labels.Namespace != "" {
				labels = tc.labels
			}
			got, err := decodeQueryResponse(strings.NewReader(tc.body), labels, newOpenPodIndex())
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got error %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got.status != tc.status || got.resultType != tc.resultType || got.series != tc.series ||
				got.errorType != tc.errorType || got.errorText != tc.errText || got.result.unlabelled != tc.unlabelled {
				t.Errorf("got status %q type %q series %d errorType %q error %q unlabelled %d", got.status, got.resultType, got.series, got.errorType, got.errorText, got.result.unlabelled)
			}
			if len(got.warnings) != len(tc.warnings) {
				t.Errorf("warnings %q, want %q", got.warnings, tc.warnings)
			}
			for i := range min(len(got.warnings), len(tc.warnings)) {
				if got.warnings[i] != tc.warnings[i] {
					t.Errorf("warnings %q, want %q", got.warnings, tc.warnings)
				}
			}
			if n := got.result.pods() - len(got.result.duplicates); n != len(tc.values) {
				t.Errorf("decoded %d pods %v, want %d", n, got.result.values, len(tc.values))
			}
			for key, want := range tc.values {
				s := got.result.sampleOf(key)
				switch {
				case math.IsNaN(want) || math.IsInf(want, 0):
					if s.Present || !errors.Is(s.Err, ErrNonFinite) || (!math.IsNaN(want) && s.Value != want) {
						t.Errorf("%v: got %+v, want a non-finite rejection of %v", key, s, want)
					}
				case !s.Present || s.Value != want:
					t.Errorf("%v: got %+v, want %v", key, s, want)
				}
			}
			for _, key := range tc.duplicates {
				var dup *DuplicateSeriesError
				if s := got.result.sampleOf(key); s.Present || !errors.As(s.Err, &dup) {
					t.Errorf("%v: got %+v, want a duplicate", key, s)
				}
			}
			if len(got.result.duplicates) != len(tc.duplicates) {
				t.Errorf("duplicates %v, want %v", got.result.duplicates, tc.duplicates)
			}
		})
	}
}

func TestDecodeQueryResponse_DuplicateNamesEverySeries(t *testing.T) {
	body := `{"status":"success","data":{"resultType":"vector","result":[` +
		`{"metric":{"namespace":"n","pod":"p","instance":"a"},"value":[1,"1"]},` +
		`{"metric":{"pod":"p","namespace":"n"},"value":[1,"2"]},` +
		`{"metric":{"instance":"c","namespace":"n","pod":"p"},"value":[1,"3"]}]}}`
	got, err := decodeQueryResponse(strings.NewReader(body), DefaultLabels, newOpenPodIndex())
	if err != nil {
		t.Fatal(err)
	}
	var dup *DuplicateSeriesError
	if s := got.result.sampleOf(podKey{"n", "p"}); !errors.As(s.Err, &dup) {
		t.Fatalf("got %+v", s)
	}
	want := []string{`{instance="a", namespace="n", pod="p"}`, `{namespace="n", pod="p"}`, `{instance="c", namespace="n", pod="p"}`}
	if len(dup.Series) != len(want) {
		t.Fatalf("series %q, want %q", dup.Series, want)
	}
	for i := range want {
		if dup.Series[i] != want[i] {
			t.Errorf("series %q, want %q", dup.Series, want)
		}
	}
}
