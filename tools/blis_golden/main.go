// Command blisgolden computes golden step-time values with BLIS's own trained-physics latency
// model, for the bayes_latency feature-parity test (tests/test_blis_golden.py).
//
// It is NOT built inside bayes_latency: tools/blis_golden/regenerate.sh copies this file into an
// unpacked BLIS source tree (as cmd/blisgolden/main.go) and builds it there with the vendored
// modules, so it links against exactly the BLIS code it documents.
//
// Input (-cases FILE, JSON):
//
//	{"coefficients": {"name": [11 floats], ...},
//	 "model_config_dir": "optional dir that relative model_config paths are resolved against",
//	 "cases": [{"id": str, "model_config": path to an HF config.json, "model": optional HF name
//	            (for BLIS's name-based weight-precision fallback; default: file stem),
//	            "gpu": "H100"|"A100-SXM"|"L40S", "tp": int, "dp": int (default 1),
//	            "requests": [{"input_len": int, "progress_index": int,
//	                          "num_new_tokens": int, "n_output": int}, ...]}, ...]}
//
// Output (-out FILE, JSON): the BLIS commit, the hardware entries used, and per case the echoed
// case plus
//
//   - features: the 11 BLIS basis values, one per beta slot, extracted through the public
//     StepTime with a unit coefficient vector scaled by S (Beta = S·e_j, 11 long so that the
//     prefill split and the decode split are both on, see the mode-flag check below):
//     feature_j = StepTime/S. StepTime truncates to int64 µs and returns max(1, ·), so the
//     resolution is 1/S µs. S is first 1e6 (resolution 1e-6 µs); a result of 1 is re-probed
//     with S = 1e12 and reported as 0 when still 1 (the feature is below 2e-12 µs, i.e. zero);
//     then S is raised to the largest power of ten with S·feature <= 1e15 (still exact in
//     float64 and int64), so every nonzero feature carries ~15 significant digits.
//     feature_scale_log10 records the S used per slot.
//   - step_time: StepTime (int64 µs) for each named coefficient vector.
//   - model_params: the TrainedPhysicsModel's frozen architecture fields (read by reflection;
//     they are unexported), e.g. headDim = hidden/heads, dKV, kEff, weightBPP, flopsPeakUs.
//   - check: max |Σ beta_j·feature_j − StepTime| over the vectors (self-consistency).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"

	"github.com/inference-sim/inference-sim/sim"
	"github.com/inference-sim/inference-sim/sim/latency"
)

const nBeta = 11

// Slot names, in BLIS's positional order (sim/latency/trained_physics_model.go StepTime).
var slotNames = [nBeta]string{
	"prefill_compute", "decode_compute", "weight_loading", "tp_comm", "per_layer",
	"per_request", "per_step", "moe_layer", "prefill_memory", "decode_memory", "moe_dispatch",
}

type reqIn struct {
	InputLen      int   `json:"input_len"`
	ProgressIndex int64 `json:"progress_index"`
	NumNewTokens  int   `json:"num_new_tokens"`
	NOutput       int   `json:"n_output"`
}

type caseIn struct {
	ID          string  `json:"id"`
	ModelConfig string  `json:"model_config"`
	Model       string  `json:"model,omitempty"`
	GPU         string  `json:"gpu"`
	TP          int     `json:"tp"`
	DP          int     `json:"dp"`
	Requests    []reqIn `json:"requests"`
	// Category is free-form metadata from make_cases.py, echoed unchanged.
	Category json.RawMessage `json:"category,omitempty"`
}

type input struct {
	Coefficients   map[string][]float64 `json:"coefficients"`
	ModelConfigDir string               `json:"model_config_dir,omitempty"`
	Cases          []caseIn             `json:"cases"`
}

type caseOut struct {
	Case              caseIn             `json:"case"`
	Features          []float64          `json:"features"`
	FeatureScaleLog10 []int              `json:"feature_scale_log10"`
	StepTime          map[string]int64   `json:"step_time"`
	ModelParams       map[string]any     `json:"model_params"`
	Check             map[string]float64 `json:"check"`
}

type output struct {
	BlisCommit      string                       `json:"blis_commit"`
	Generator       string                       `json:"generator"`
	SlotNames       []string                     `json:"slot_names"`
	Coefficients    map[string][]float64         `json:"coefficients"`
	Hardware        map[string]sim.HardwareCalib `json:"hardware"`
	FeatureNote     string                       `json:"feature_note"`
	Results         []caseOut                    `json:"results"`
	MaxSelfRelError float64                      `json:"max_self_rel_error"`
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "blisgolden: "+format+"\n", args...)
	os.Exit(1)
}

// buildModel builds the TrainedPhysicsModel exactly as `blis run --latency-model trained-physics`
// does (cmd/root.go): ParseHFConfig -> GetModelConfigFromHF -> GetHWConfig -> name-based weight
// precision fallback (cmd/hfconfig.go applyWeightPrecisionFallback) -> NewModelHardwareConfig
// (EP off, default MoE comm backend, max-model-len 0) -> NewLatencyModel("trained-physics").
func buildModel(c caseIn, cfgPath, hwPath string, beta []float64) (*latency.TrainedPhysicsModel, sim.HardwareCalib, error) {
	hf, err := latency.ParseHFConfig(cfgPath)
	if err != nil {
		return nil, sim.HardwareCalib{}, err
	}
	mc, err := latency.GetModelConfigFromHF(hf)
	if err != nil {
		return nil, sim.HardwareCalib{}, err
	}
	hc, err := latency.GetHWConfig(hwPath, c.GPU)
	if err != nil {
		return nil, sim.HardwareCalib{}, err
	}
	model := c.Model
	if model == "" {
		model = strings.TrimSuffix(filepath.Base(cfgPath), filepath.Ext(cfgPath))
	}
	if mc.WeightBytesPerParam == 0 {
		mc.WeightBytesPerParam = latency.InferWeightBytesFromModelName(model)
	}
	dp := c.DP
	if dp == 0 {
		dp = 1
	}
	if dp > 1 && !mc.IsMoE() {
		return nil, hc, fmt.Errorf("dp=%d needs a MoE model", dp)
	}
	hw := sim.NewModelHardwareConfig(*mc, hc, model, c.GPU, c.TP, dp, false, "", "trained-physics", 0)
	coeffs := sim.LatencyCoeffs{AlphaCoeffs: []float64{0, 0, 0}, BetaCoeffs: beta}
	lm, err := latency.NewLatencyModel(coeffs, hw)
	if err != nil {
		return nil, hc, err
	}
	m, ok := lm.(*latency.TrainedPhysicsModel)
	if !ok {
		return nil, hc, fmt.Errorf("NewLatencyModel returned %T, not *TrainedPhysicsModel", lm)
	}
	// With 11 betas both splits must be on, so that slot 0/8 and 1/9 isolate one basis each
	// (otherwise BLIS computes beta·max(compute, memory)).
	v := reflect.ValueOf(m).Elem()
	if !v.FieldByName("prefillSplit").Bool() || !v.FieldByName("decodeSplit").Bool() {
		return nil, hc, fmt.Errorf("prefill/decode split not both on with %d betas", len(beta))
	}
	if len(m.Beta) != nBeta {
		return nil, hc, fmt.Errorf("model has %d betas, want %d", len(m.Beta), nBeta)
	}
	return m, hc, nil
}

// modelParams dumps the unexported scalar fields of a TrainedPhysicsModel.
func modelParams(m *latency.TrainedPhysicsModel) map[string]any {
	out := map[string]any{}
	v := reflect.ValueOf(m).Elem()
	t := v.Type()
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Int, reflect.Int64:
			out[t.Field(i).Name] = f.Int()
		case reflect.Float64:
			out[t.Field(i).Name] = f.Float()
		case reflect.Bool:
			out[t.Field(i).Name] = f.Bool()
		}
	}
	return out
}

func makeBatch(c caseIn) ([]*sim.Request, error) {
	batch := make([]*sim.Request, 0, len(c.Requests))
	for i, r := range c.Requests {
		if r.InputLen < 0 || r.NOutput < 0 || r.ProgressIndex < 0 || r.NumNewTokens < 0 {
			return nil, fmt.Errorf("request %d: negative field", i)
		}
		batch = append(batch, &sim.Request{
			ID:            fmt.Sprintf("%s/%d", c.ID, i),
			InputTokens:   make([]sim.TokenID, r.InputLen),
			OutputTokens:  make([]sim.TokenID, r.NOutput),
			ProgressIndex: r.ProgressIndex,
			NumNewTokens:  r.NumNewTokens,
			State:         sim.StateRunning,
		})
	}
	return batch, nil
}

// feature extracts basis j through the public StepTime (see the package comment).
func feature(m *latency.TrainedPhysicsModel, batch []*sim.Request, j int) (float64, int) {
	probe := func(k int) int64 {
		for i := range m.Beta {
			m.Beta[i] = 0
		}
		m.Beta[j] = math.Pow(10, float64(k))
		return m.StepTime(batch)
	}
	k := 6
	st := probe(k)
	if st <= 1 {
		k = 12
		st = probe(k)
		if st <= 1 {
			return 0, k
		}
	}
	f := float64(st) / math.Pow(10, float64(k))
	// refine: largest k with 10^k·f <= 1e15 (exact in float64/int64)
	kr := int(math.Floor(15 - math.Log10(f)))
	if kr > k {
		k = kr
		f = float64(probe(k)) / math.Pow(10, float64(k))
	}
	return f, k
}

func main() {
	casesPath := flag.String("cases", "", "cases JSON (see the package comment)")
	outPath := flag.String("out", "", "results JSON to write")
	hwPath := flag.String("hardware-config", "hardware_config.json", "BLIS hardware_config.json")
	commit := flag.String("commit", "unknown", "BLIS commit recorded in the output")
	generator := flag.String("generator", "", "generation command recorded in the output")
	flag.Parse()
	if *casesPath == "" || *outPath == "" {
		fail("usage: blisgolden -cases CASES.json -out RESULTS.json [-hardware-config F] [-commit C]")
	}
	raw, err := os.ReadFile(*casesPath)
	if err != nil {
		fail("%v", err)
	}
	var in input
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		fail("parse %s: %v", *casesPath, err)
	}
	names := make([]string, 0, len(in.Coefficients))
	for n, b := range in.Coefficients {
		if len(b) != nBeta {
			fail("coefficient vector %q has %d values, want %d", n, len(b), nBeta)
		}
		names = append(names, n)
	}
	sort.Strings(names)

	out := output{
		BlisCommit:   *commit,
		Generator:    *generator,
		SlotNames:    slotNames[:],
		Coefficients: in.Coefficients,
		Hardware:     map[string]sim.HardwareCalib{},
		FeatureNote: "features[j] = StepTime(Beta = 10^k e_j)/10^k with k = feature_scale_log10[j] " +
			"(resolution 10^-k us, k >= 6; 0 = StepTime stayed 1 at k = 12); StepTime truncates to int64 us",
	}
	seen := map[string]bool{}
	for _, c := range in.Cases {
		if seen[c.ID] {
			fail("duplicate case id %q", c.ID)
		}
		seen[c.ID] = true
		if c.DP == 0 {
			c.DP = 1
		}
		cfgPath := c.ModelConfig
		if !filepath.IsAbs(cfgPath) && in.ModelConfigDir != "" {
			cfgPath = filepath.Join(in.ModelConfigDir, cfgPath)
		}
		m, hc, err := buildModel(c, cfgPath, *hwPath, make([]float64, nBeta))
		if err != nil {
			fail("case %s: %v", c.ID, err)
		}
		out.Hardware[c.GPU] = hc
		batch, err := makeBatch(c)
		if err != nil {
			fail("case %s: %v", c.ID, err)
		}
		co := caseOut{Case: c, Features: make([]float64, nBeta), FeatureScaleLog10: make([]int, nBeta),
			StepTime: map[string]int64{}, ModelParams: modelParams(m), Check: map[string]float64{}}
		for j := 0; j < nBeta; j++ {
			co.Features[j], co.FeatureScaleLog10[j] = feature(m, batch, j)
		}
		maxAbs, maxRel := 0.0, 0.0
		for _, n := range names {
			// a fresh model per vector, constructed with it as `blis run --beta-coeffs` would
			mv, _, err := buildModel(c, cfgPath, *hwPath, append([]float64(nil), in.Coefficients[n]...))
			if err != nil {
				fail("case %s vector %s: %v", c.ID, n, err)
			}
			st := mv.StepTime(batch)
			co.StepTime[n] = st
			pred := 0.0
			for j := 0; j < nBeta; j++ {
				pred += in.Coefficients[n][j] * co.Features[j]
			}
			// StepTime = max(1, trunc(pred)): compare with the truncated prediction
			d := math.Abs(pred - float64(st))
			maxAbs = math.Max(maxAbs, d)
			maxRel = math.Max(maxRel, d/math.Max(float64(st), 1))
			if d > math.Max(1.0, 1e-3*float64(st)) {
				fail("case %s vector %s: sum beta*feature = %.6f but StepTime = %d", c.ID, n, pred, st)
			}
		}
		co.Check["max_abs_error_us"] = maxAbs
		co.Check["max_rel_error"] = maxRel
		out.MaxSelfRelError = math.Max(out.MaxSelfRelError, maxRel)
		out.Results = append(out.Results, co)
	}
	buf, err := json.Marshal(out)
	if err != nil {
		fail("%v", err)
	}
	if err := os.WriteFile(*outPath, buf, 0o644); err != nil {
		fail("%v", err)
	}
	fmt.Fprintf(os.Stderr, "blisgolden: %d cases, %d vectors, max self-consistency rel error %.3g -> %s\n",
		len(out.Results), len(names), out.MaxSelfRelError, *outPath)
}
