// Command uniquevectors inserts a corpus of job args and unique options through
// River Go into a freshly migrated Postgres database and writes the resulting
// encoded args, unique keys and unique state masks as a JSON table. The table
// is the reference that river_anyio's JSON encoder and unique-key code are
// tested against.
package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivershared/structtag"
	"github.com/riverqueue/river/rivertype"
)

// ---------------------------------------------------------------------------
// Args types. Every type carries its kind in an unexported field so one type
// can be inserted under several kinds; unexported fields are invisible to both
// encoding/json and River's unique-tag walk.

type BasicArgs struct {
	kind   string
	Name   string   `json:"name"`
	Count  int64    `json:"count"`
	Ratio  float64  `json:"ratio"`
	Tags   []string `json:"tags"`
	Active bool     `json:"active"`
}

func (a BasicArgs) Kind() string { return a.kind }

type FloatArgs struct {
	kind   string
	F      float64   `json:"f"`
	Values []float64 `json:"values"`
	Big    uint64    `json:"big"`
	Neg    int64     `json:"neg"`
}

func (a FloatArgs) Kind() string { return a.kind }

type StringArgs struct {
	kind string
	S    string `json:"s"`
	Z    string `json:"z"`
	A    string `json:"a"`
}

func (a StringArgs) Kind() string { return a.kind }

type Inner struct {
	Z int    `json:"z"`
	A string `json:"a"`
}

type NestedArgs struct {
	kind  string
	Zeta  string         `json:"zeta"`
	Meta  map[string]any `json:"meta"`
	Inner Inner          `json:"inner"`
	Ptr   *Inner         `json:"ptr,omitempty"`
	List  []Inner        `json:"list"`
}

func (a NestedArgs) Kind() string { return a.kind }

type OmitArgs struct {
	kind string
	A    string         `json:"a,omitempty"`
	B    int            `json:"b,omitempty"`
	C    []int          `json:"c,omitempty"`
	D    map[string]int `json:"d,omitempty"`
	E    *string        `json:"e,omitempty"`
	F    bool           `json:"f,omitempty"`
	G    float64        `json:"g,omitempty"`
	H    string         `json:"h"`
}

func (a OmitArgs) Kind() string { return a.kind }

type EmptyArgs struct {
	kind string
}

func (a EmptyArgs) Kind() string { return a.kind }

type MapHolderArgs struct {
	kind string
	M    map[string]any `json:"m"`
	K    string         `json:"k"`
}

func (a MapHolderArgs) Kind() string { return a.kind }

type TaggedArgs struct {
	kind       string
	CustomerID string  `json:"customer_id" river:"unique"`
	TraceID    string  `json:"trace_id"`
	Amount     float64 `json:"amount" river:"unique"`
}

func (a TaggedArgs) Kind() string { return a.kind }

type Extra struct {
	Code string `json:"code" river:"unique"`
	Skip string `json:"skip"`
}

type Addresses struct {
	Recipient string `json:"recipient" river:"unique"`
	Sender    string `json:"sender"`
	Extra     *Extra `json:"extra,omitempty"`
}

type TaggedNestedArgs struct {
	kind      string
	Subject   string    `json:"subject" river:"unique"`
	Addresses Addresses `json:"addresses"`
	Body      string    `json:"body"`
	Zed       int       `json:"zed" river:"unique"`
}

func (a TaggedNestedArgs) Kind() string { return a.kind }

type Customer struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

type TaggedWholeArgs struct {
	kind     string
	Note     string    `json:"note"`
	Customer *Customer `json:"customer" river:"unique"`
	Level    int       `json:"level" river:"unique"`
}

func (a TaggedWholeArgs) Kind() string { return a.kind }

type TaggedOmitArgs struct {
	kind string
	A    string `json:"a,omitempty" river:"unique"`
	B    int    `json:"b,omitempty" river:"unique"`
	C    string `json:"c"`
}

func (a TaggedOmitArgs) Kind() string { return a.kind }

type Addr struct {
	City string `json:"city" river:"unique"`
	Zip  string `json:"zip"`
}

// TaggedSameTypeArgs has two fields of one struct type; River visits each
// struct type once per args type, so only the first field's tags count.
type TaggedSameTypeArgs struct {
	kind string
	To   Addr `json:"to"`
	From Addr `json:"from"`
}

func (a TaggedSameTypeArgs) Kind() string { return a.kind }

type TaggedOddNamesArgs struct {
	kind  string
	Dot   string `json:"a.b" river:"unique"`
	Pipe  string `json:"p|q" river:"unique"`
	A     Inner2 `json:"a"`
	Plain string `json:"plain"`
}

type Inner2 struct {
	B string `json:"b" river:"unique"`
}

func (a TaggedOddNamesArgs) Kind() string { return a.kind }

type TaggedNumericArgs struct {
	kind string
	N    string `json:"2" river:"unique"`
	M    string `json:"m"`
}

func (a TaggedNumericArgs) Kind() string { return a.kind }

type QuirkKeysArgs struct {
	kind string
	Lt   string `json:"<a>"`
	Amp  string `json:"b&c"`
	E    string `json:"é"`
	Plus string `json:"+x"`
}

func (a QuirkKeysArgs) Kind() string { return a.kind }

type TimeBytesArgs struct {
	kind string
	At   time.Time  `json:"at"`
	When time.Time  `json:"when"`
	Opt  *time.Time `json:"opt,omitempty"`
	Data []byte     `json:"data"`
	Nil  []byte     `json:"nil"`
}

func (a TimeBytesArgs) Kind() string { return a.kind }

// ---------------------------------------------------------------------------
// Description of a Go value in a form the Python tests can rebuild. Structs
// list their fields in declaration order with the JSON name and omitempty
// flag; maps list their entries (Go sorts them when encoding). Strings are
// carried as base64 of their exact bytes so invalid UTF-8 survives.

func describe(v reflect.Value) map[string]any {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return map[string]any{"t": "null"}
		}
		return describe(v.Elem())
	}
	if v.Type() == reflect.TypeFor[time.Time]() {
		t := v.Interface().(time.Time) //nolint:forcetypeassert
		_, off := t.Zone()
		return map[string]any{"t": "time", "unix_us": t.UnixMicro(), "offset_seconds": off}
	}
	switch v.Kind() {
	case reflect.Struct:
		var fields []map[string]any
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			tag := f.Tag.Get("json")
			name, opts, _ := strings.Cut(tag, ",")
			if name == "-" && opts == "" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			fields = append(fields, map[string]any{
				"name":      f.Name,
				"json":      name,
				"omitempty": strings.Contains(","+opts+",", ",omitempty,"),
				"value":     describe(v.Field(i)),
			})
		}
		if fields == nil {
			fields = []map[string]any{}
		}
		return map[string]any{"t": "struct", "fields": fields}
	case reflect.Map:
		if v.IsNil() {
			return map[string]any{"t": "null"}
		}
		items := []map[string]any{}
		iter := v.MapRange()
		for iter.Next() {
			k := iter.Key().String()
			items = append(items, map[string]any{"k_b64": base64.StdEncoding.EncodeToString([]byte(k)), "k": k, "v": describe(iter.Value())})
		}
		// Reverse key order: deterministic output that is not already sorted,
		// so the tests show the encoder doing the sorting.
		sort.Slice(items, func(i, j int) bool { return items[i]["k"].(string) > items[j]["k"].(string) }) //nolint:forcetypeassert
		return map[string]any{"t": "map", "items": items}
	case reflect.Slice:
		if v.IsNil() {
			return map[string]any{"t": "null"}
		}
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return map[string]any{"t": "bytes", "b64": base64.StdEncoding.EncodeToString(v.Bytes())}
		}
		items := []map[string]any{}
		for i := range v.Len() {
			items = append(items, describe(v.Index(i)))
		}
		return map[string]any{"t": "list", "items": items}
	case reflect.String:
		return map[string]any{"t": "str", "b64": base64.StdEncoding.EncodeToString([]byte(v.String())), "v": v.String()}
	case reflect.Bool:
		return map[string]any{"t": "bool", "v": v.Bool()}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return map[string]any{"t": "int", "v": strconv.FormatInt(v.Int(), 10)}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"t": "int", "v": strconv.FormatUint(v.Uint(), 10)}
	case reflect.Float64:
		return map[string]any{"t": "float", "v": strconv.FormatFloat(v.Float(), 'g', -1, 64)}
	}
	panic(fmt.Sprintf("describe: unsupported kind %s", v.Kind()))
}

// ---------------------------------------------------------------------------

type testCase struct {
	name string
	args river.JobArgs
	opts river.InsertOpts
}

type caseOut struct {
	Name            string         `json:"name"`
	Kind            string         `json:"kind"`
	GoArgsJSON      string         `json:"go_args_json"`
	DBArgs          string         `json:"db_args,omitempty"`
	Args            map[string]any `json:"args"`
	UniquePaths     []string       `json:"unique_paths"`
	ByArgs          any            `json:"by_args"`
	ByPeriodSeconds *float64       `json:"by_period_seconds"`
	ByQueue         bool           `json:"by_queue"`
	ByState         []string       `json:"by_state"`
	ExcludeKind     bool           `json:"exclude_kind"`
	Queue           string         `json:"queue"`
	ScheduledAt     *string        `json:"scheduled_at"`
	UniqueKeyHex    *string        `json:"unique_key"`
	UniqueStates    *int           `json:"unique_states"`
	Error           *string        `json:"error,omitempty"`
}

func ptr[T any](v T) *T { return &v }

func states(s ...rivertype.JobState) []rivertype.JobState { return s }

func corpus() []testCase {
	var (
		t0     = time.Date(2024, 3, 13, 17, 42, 31, 123456000, time.UTC) // a Wednesday
		ist    = time.FixedZone("IST", 5*3600+30*60)
		pst    = time.FixedZone("PST", -8*3600)
		tIST   = time.Date(2024, 3, 10, 1, 30, 0, 0, ist) // 2024-03-09T20:00Z
		tPST   = time.Date(2024, 12, 31, 20, 15, 59, 999999000, pst)
		sunday = time.Date(2024, 3, 17, 23, 59, 59, 0, time.UTC)
		monday = time.Date(2024, 3, 18, 0, 0, 0, 0, time.UTC)
		hour   = time.Hour
		day    = 24 * time.Hour
		week   = 7 * day
		estr   = "set"
	)
	basic := BasicArgs{kind: "basic", Name: "Alice", Count: 42, Ratio: 0.25, Tags: []string{"x", "y"}, Active: true}
	defaultState := []rivertype.JobState(nil)
	_ = defaultState

	return []testCase{
		// Plain encodings, unique by args over all top-level keys.
		{"basic_by_args", basic, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"basic_kind_only_by_state_default", basic, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByState: rivertype.UniqueOptsByStateDefault()}}},
		{"basic_by_queue", basic, river.InsertOpts{Queue: "email_queue", UniqueOpts: river.UniqueOpts{ByQueue: true}}},
		{"basic_by_args_queue_period", basic, river.InsertOpts{Queue: "q2", ScheduledAt: t0, UniqueOpts: river.UniqueOpts{ByArgs: true, ByQueue: true, ByPeriod: hour}}},
		{"basic_exclude_kind_by_args", basic, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ExcludeKind: true}}},
		{"basic_exclude_kind_by_queue", basic, river.InsertOpts{Queue: "other", UniqueOpts: river.UniqueOpts{ByQueue: true, ExcludeKind: true}}},
		{"basic_exclude_kind_by_period", basic, river.InsertOpts{ScheduledAt: t0, UniqueOpts: river.UniqueOpts{ByPeriod: 15 * time.Minute, ExcludeKind: true}}},
		{"basic_nil_tags_false", BasicArgs{kind: "basic", Name: "", Tags: nil}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"basic_empty_tags", BasicArgs{kind: "basic", Name: "b", Tags: []string{}, Count: -7}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},

		// Floats and integers.
		{"floats_simple", FloatArgs{kind: "floats", F: 1.0, Values: []float64{0.1, 0.2, 0.3, 100, 1.5, -2.25, 123456789.125}}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"floats_exponents", FloatArgs{kind: "floats", F: 1e21, Values: []float64{1e20, 1e21, 1e22, 1e-6, 1e-7, 1.5e-5, 2.5e-9, 1e-10, 1e-100, 1e100, 5e-324, math.MaxFloat64, -1e-7, 1e16, 1.2345e17}}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"floats_negative_zero_bigints", FloatArgs{kind: "floats", F: math.Copysign(0, -1), Values: []float64{float64(1 << 60), float64(1<<53 + 2), 9007199254740993, -0.0}, Big: math.MaxUint64, Neg: math.MinInt64}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"floats_nil_values", FloatArgs{kind: "floats", F: 0.5}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByQueue: true}}},

		// Strings and escaping. (NUL is left out: Postgres jsonb rejects \u0000.)
		{"strings_unicode", StringArgs{kind: "strings", S: "héllo wörld ключ 中文", Z: "emoji 😀 𝄞 🇫🇷", A: "ascii"}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"strings_html", StringArgs{kind: "strings", S: "<script>alert('x')</script>", Z: "a&b>c", A: `quote " backslash \ slash /`}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"strings_separators", StringArgs{kind: "strings", S: "line\u2028sep\u2029para", Z: "\u2027\u202a", A: "\u00a0\ufeff\ufffd"}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"strings_controls", StringArgs{kind: "strings", S: "\x01\x07\b\t\n\v\f\r\x1b\x1f", Z: "del\x7f end", A: "tab\there"}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"strings_invalid_utf8", StringArgs{kind: "strings", S: "bad\xffbyte", Z: "\xc3", A: "ok"}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"strings_kind_unicode", StringArgs{kind: "kind.ü/<x>", S: "s"}, river.InsertOpts{Queue: "queue_1", UniqueOpts: river.UniqueOpts{ByArgs: true, ByQueue: true}}},

		// Nested objects, lists and maps.
		{"nested_full", NestedArgs{kind: "nested", Zeta: "z", Meta: map[string]any{"zz": 1, "aa": []any{1, "two", 3.5, nil, true}, "mm": map[string]any{"y": false, "b": map[string]any{}}, "Éa": "accent", "Za": "upper", "a b": "space", "": "empty"}, Inner: Inner{Z: 9, A: "inner"}, Ptr: &Inner{Z: 1, A: "p"}, List: []Inner{{Z: 2, A: "l1"}, {Z: 3, A: "l2"}}}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"nested_nil_ptr_empty_list", NestedArgs{kind: "nested", Zeta: "", Meta: nil, List: []Inner{}}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"map_holder_html_keys", MapHolderArgs{kind: "maps", M: map[string]any{"<": 1, "é<": 2, "a\"b": 3, "\u2028": 4, "&&": 5, "~": 6, "\x7f": 7, "\x01": 8}, K: "k"}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"quirk_keys_by_args", QuirkKeysArgs{kind: "quirk_keys", Lt: "1", Amp: "2", E: "3", Plus: "4"}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},

		// Omitempty.
		{"omit_all_empty", OmitArgs{kind: "omit"}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"omit_all_set", OmitArgs{kind: "omit", A: "a", B: -1, C: []int{0}, D: map[string]int{"k": 0}, E: &estr, F: true, G: 0.5, H: "h"}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"omit_empty_containers", OmitArgs{kind: "omit", C: []int{}, D: map[string]int{}, G: math.Copysign(0, -1)}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},

		// Empty args.
		{"empty_by_args", EmptyArgs{kind: "empty"}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"empty_by_args_exclude_kind", EmptyArgs{kind: "empty"}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ExcludeKind: true}}},

		// Tagged field subsets.
		{"tagged_subset", TaggedArgs{kind: "tagged", CustomerID: "cus_123", TraceID: "trace-abc", Amount: 10.0}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"tagged_subset_not_by_args", TaggedArgs{kind: "tagged", CustomerID: "cus_123", TraceID: "trace-abc", Amount: 10.0}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByQueue: true}}},
		{"tagged_nested", TaggedNestedArgs{kind: "tagged_nested", Subject: "Test Email", Addresses: Addresses{Recipient: "user@example.com", Sender: "s@example.com"}, Body: "b", Zed: 3}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"tagged_nested_deep", TaggedNestedArgs{kind: "tagged_nested", Subject: "<S&>", Addresses: Addresses{Recipient: "r", Extra: &Extra{Code: "c\u2028", Skip: "x"}}, Zed: -1}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByQueue: true}}},
		{"tagged_whole_struct", TaggedWholeArgs{kind: "tagged_whole", Note: "n", Customer: &Customer{ID: "c1", Name: "Ann"}, Level: 2}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"tagged_whole_struct_nil", TaggedWholeArgs{kind: "tagged_whole", Note: "n"}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"tagged_all_missing", TaggedOmitArgs{kind: "tagged_omit", C: "c"}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"tagged_one_missing", TaggedOmitArgs{kind: "tagged_omit", B: 5, C: "c"}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"tagged_all_missing_exclude_kind", TaggedOmitArgs{kind: "tagged_omit"}, river.InsertOpts{ScheduledAt: t0, UniqueOpts: river.UniqueOpts{ByArgs: true, ExcludeKind: true, ByPeriod: day}}},
		{"tagged_same_type_twice", TaggedSameTypeArgs{kind: "tagged_same", To: Addr{City: "Paris", Zip: "75001"}, From: Addr{City: "Oslo", Zip: "0150"}}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"tagged_odd_names", TaggedOddNamesArgs{kind: "tagged_odd", Dot: "dot", Pipe: "pipe", A: Inner2{B: "nested"}, Plain: "p"}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"tagged_numeric_name", TaggedNumericArgs{kind: "tagged_numeric", N: "two", M: "m"}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},

		// Times and bytes.
		{"time_bytes", TimeBytesArgs{kind: "time_bytes", At: t0, When: tIST, Data: []byte("hello\x00\xff"), Nil: nil}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
		{"time_bytes_offsets", TimeBytesArgs{kind: "time_bytes", At: tPST, When: time.Date(2001, 2, 3, 4, 5, 6, 100000000, time.FixedZone("odd", -(3*3600+25*60+17))), Opt: &monday, Data: []byte{}}, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},

		// Periods.
		{"period_1s", basic, river.InsertOpts{ScheduledAt: t0, UniqueOpts: river.UniqueOpts{ByPeriod: time.Second}}},
		{"period_15m", basic, river.InsertOpts{ScheduledAt: t0, UniqueOpts: river.UniqueOpts{ByPeriod: 15 * time.Minute}}},
		{"period_1h", basic, river.InsertOpts{ScheduledAt: t0, UniqueOpts: river.UniqueOpts{ByPeriod: hour}}},
		{"period_24h", basic, river.InsertOpts{ScheduledAt: t0, UniqueOpts: river.UniqueOpts{ByPeriod: day}}},
		{"period_7d_wednesday", basic, river.InsertOpts{ScheduledAt: t0, UniqueOpts: river.UniqueOpts{ByPeriod: week}}},
		{"period_7d_sunday_end", basic, river.InsertOpts{ScheduledAt: sunday, UniqueOpts: river.UniqueOpts{ByPeriod: week}}},
		{"period_7d_monday_start", basic, river.InsertOpts{ScheduledAt: monday, UniqueOpts: river.UniqueOpts{ByPeriod: week}}},
		{"period_90s", basic, river.InsertOpts{ScheduledAt: t0, UniqueOpts: river.UniqueOpts{ByPeriod: 90 * time.Second}}},
		{"period_1500ms", basic, river.InsertOpts{ScheduledAt: t0, UniqueOpts: river.UniqueOpts{ByPeriod: 1500 * time.Millisecond}}},
		{"period_24h_ist", basic, river.InsertOpts{ScheduledAt: tIST, UniqueOpts: river.UniqueOpts{ByPeriod: day}}},
		{"period_1h_ist", basic, river.InsertOpts{ScheduledAt: tIST, UniqueOpts: river.UniqueOpts{ByPeriod: hour}}},
		{"period_1s_pst", basic, river.InsertOpts{ScheduledAt: tPST, UniqueOpts: river.UniqueOpts{ByPeriod: time.Second}}},
		{"period_7d_pst", basic, river.InsertOpts{ScheduledAt: tPST, UniqueOpts: river.UniqueOpts{ByPeriod: week}}},
		{"period_30d", basic, river.InsertOpts{ScheduledAt: t0, UniqueOpts: river.UniqueOpts{ByPeriod: 30 * day}}},

		// States.
		{"state_custom_required_only", basic, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: states(rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRunning, rivertype.JobStateScheduled)}}},
		{"state_custom_all", basic, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByQueue: true, ByState: rivertype.JobStates()}}},
		{"state_custom_cancelled_discarded", basic, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByState: states(rivertype.JobStateScheduled, rivertype.JobStateRunning, rivertype.JobStatePending, rivertype.JobStateAvailable, rivertype.JobStateCancelled, rivertype.JobStateDiscarded)}}},
		{"state_empty_slice_means_default", basic, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByState: []rivertype.JobState{}}}},
		{"combo_everything", TaggedNestedArgs{kind: "combo", Subject: "s", Addresses: Addresses{Recipient: "r"}}, river.InsertOpts{Queue: "combo_q", ScheduledAt: tIST, UniqueOpts: river.UniqueOpts{ByArgs: true, ByQueue: true, ByPeriod: 6 * hour, ExcludeKind: true, ByState: states(rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRunning, rivertype.JobStateScheduled, rivertype.JobStateCompleted, rivertype.JobStateDiscarded)}}},

		// Rejected options.
		{"error_exclude_kind_alone", basic, river.InsertOpts{UniqueOpts: river.UniqueOpts{ExcludeKind: true}}},
		{"error_period_too_short", basic, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByPeriod: 500 * time.Millisecond}}},
		{"error_invalid_state", basic, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByState: states(rivertype.JobStateAvailable, "bogus")}}},
		{"error_missing_states", basic, river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: states(rivertype.JobStateAvailable, rivertype.JobStateCompleted)}}},
	}
}

// ---------------------------------------------------------------------------
// Extra encoder-only tables: floats, strings and times straight through
// json.Marshal, for the Python encoder tests.

func floatCases() []map[string]any {
	vals := []float64{0, math.Copysign(0, -1), 1, -1, 0.1, 0.2, 0.3, 1.0 / 3, 2.0 / 3, 100, 1e6, 1e15, 1e16, 1e17, 1e20, 1e21, 1e22,
		9.999999999999999e20, 1e-4, 1e-5, 1e-6, 9.99999e-7, 1e-7, 1e-8, 1e-9, 1e-10, 1.5e-7, 5e-324, 2.2250738585072014e-308,
		math.MaxFloat64, float64(1 << 53), float64(1<<53 + 2), float64(1 << 60), float64(1 << 63), 123456789012345678, 0.000123, 1.25e-5, 4.35, 1e300, 1e-300, 3.14159}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		for {
			f := math.Float64frombits(r.Uint64())
			if !math.IsNaN(f) && !math.IsInf(f, 0) {
				vals = append(vals, f)
				break
			}
		}
	}
	for range 300 {
		exp := r.IntN(50) - 25
		vals = append(vals, (r.Float64()*2-1)*math.Pow(10, float64(exp)))
	}
	for range 50 {
		vals = append(vals, float64(r.IntN(1000000))/float64([]int{1, 2, 4, 8, 10, 100, 1000}[r.IntN(7)]))
	}
	out := make([]map[string]any, 0, len(vals))
	for _, f := range vals {
		b, err := json.Marshal(f)
		if err != nil {
			panic(err)
		}
		out = append(out, map[string]any{"bits": fmt.Sprintf("%016x", math.Float64bits(f)), "json": string(b)})
	}
	return out
}

func stringCases() []map[string]any {
	strs := []string{"", "plain", "<>&", "\u2028\u2029", "\u2027\u202a", "é😀", "\xff", "\xc3", "\xe2\x80", "a\xf0\x9f\x98", "\xed\xa0\x80", "\xef\xbf\xbd", "\x7f", "\"\\/", "\u00ad\u0600\u200b\ufeff\U0001f600"}
	var allASCII strings.Builder
	for b := range 0x80 {
		allASCII.WriteByte(byte(b))
	}
	strs = append(strs, allASCII.String())
	out := make([]map[string]any, 0, len(strs))
	for _, s := range strs {
		b, err := json.Marshal(s)
		if err != nil {
			panic(err)
		}
		out = append(out, map[string]any{"b64": base64.StdEncoding.EncodeToString([]byte(s)), "json": string(b)})
	}
	return out
}

func timeCases() []map[string]any {
	zones := []*time.Location{time.UTC, time.FixedZone("a", 3600), time.FixedZone("b", -(9*3600 + 30*60)), time.FixedZone("c", 45), time.FixedZone("d", -59), time.FixedZone("e", 14*3600), time.FixedZone("f", 5*3600+45*60+30)}
	insts := []time.Time{
		time.Date(2024, 3, 13, 17, 42, 31, 0, time.UTC),
		time.Date(2024, 3, 13, 17, 42, 31, 500000000, time.UTC),
		time.Date(2024, 3, 13, 17, 42, 31, 120000000, time.UTC),
		time.Date(2024, 3, 13, 17, 42, 31, 1000, time.UTC),
		time.Date(2024, 3, 13, 17, 42, 31, 999999000, time.UTC),
		time.Date(1, 1, 1, 12, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC),
		time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	var out []map[string]any
	for _, t := range insts {
		for _, z := range zones {
			tz := t.In(z)
			b, err := json.Marshal(tz)
			if err != nil {
				continue // out-of-range years after shifting
			}
			_, off := tz.Zone()
			out = append(out, map[string]any{"unix_us": tz.UnixMicro(), "offset_seconds": off, "json": string(b)})
		}
	}
	return out
}

// ---------------------------------------------------------------------------

func main() {
	adminURL := flag.String("admin-url", "postgresql://postgres@127.0.0.1:55432/postgres", "URL of a database used to (re)create the scratch database")
	dbName := flag.String("db", "uq_vectors", "scratch database name (dropped and recreated)")
	outPath := flag.String("out", "../../data/unique_vectors.json", "output file")
	flag.Parse()

	if err := run(context.Background(), *adminURL, *dbName, *outPath); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, adminURL, dbName, outPath string) error {
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	ident := pgx.Identifier{dbName}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return err
	}
	_ = admin.Close(ctx)

	cfg, err := pgxpool.ParseConfig(adminURL)
	if err != nil {
		return err
	}
	cfg.ConnConfig.Database = dbName
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return err
	}
	client, err := river.NewClient(driver, &river.Config{})
	if err != nil {
		return err
	}

	var cases []caseOut
	for _, tc := range corpus() {
		out, err := runCase(ctx, pool, client, tc)
		if err != nil {
			return fmt.Errorf("case %s: %w", tc.name, err)
		}
		cases = append(cases, out)
	}

	doc := map[string]any{
		"river_version": "v0.51.2",
		"cases":         cases,
		"float_cases":   floatCases(),
		"string_cases":  stringCases(),
		"time_cases":    timeCases(),
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	return os.WriteFile(outPath, data, 0o644)
}

func runCase(ctx context.Context, pool *pgxpool.Pool, client *river.Client[pgx.Tx], tc testCase) (caseOut, error) {
	encoded, err := json.Marshal(tc.args)
	if err != nil {
		return caseOut{}, err
	}
	paths, err := structtag.SortedFieldsWithTag(tc.args, "unique")
	if err != nil {
		return caseOut{}, err
	}
	if paths == nil {
		paths = []string{}
	}
	uo := tc.opts.UniqueOpts
	out := caseOut{
		Name:        tc.name,
		Kind:        tc.args.Kind(),
		GoArgsJSON:  string(encoded),
		Args:        describe(reflect.ValueOf(tc.args)),
		UniquePaths: paths,
		ByQueue:     uo.ByQueue,
		ExcludeKind: uo.ExcludeKind,
		Queue:       tc.opts.Queue,
	}
	if out.Queue == "" {
		out.Queue = "default"
	}
	switch {
	case !uo.ByArgs:
		out.ByArgs = false
	case len(paths) > 0:
		out.ByArgs = paths
	default:
		out.ByArgs = true
	}
	if uo.ByPeriod != 0 {
		out.ByPeriodSeconds = ptr(uo.ByPeriod.Seconds())
	}
	if uo.ByState != nil {
		out.ByState = []string{}
		for _, s := range uo.ByState {
			out.ByState = append(out.ByState, string(s))
		}
	}
	if !tc.opts.ScheduledAt.IsZero() {
		out.ScheduledAt = ptr(tc.opts.ScheduledAt.Format(time.RFC3339Nano))
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		return caseOut{}, err
	}
	defer func() { _ = tx.Rollback(ctx) }()

	opts := tc.opts
	res, err := client.InsertTx(ctx, tx, tc.args, &opts)
	if err != nil {
		out.Error = ptr(err.Error())
		return out, nil
	}
	var (
		dbArgs    string
		keyHex    *string
		statesInt *int
	)
	if err := tx.QueryRow(ctx, "SELECT args::text, encode(unique_key, 'hex'), unique_states::int FROM river_job WHERE id = $1", res.Job.ID).Scan(&dbArgs, &keyHex, &statesInt); err != nil {
		return caseOut{}, err
	}
	if keyHex != nil && hex.EncodeToString(res.Job.UniqueKey) != *keyHex {
		return caseOut{}, fmt.Errorf("unique key read back differs from the insert result")
	}
	out.DBArgs = dbArgs
	out.UniqueKeyHex = keyHex
	out.UniqueStates = statesInt
	return out, nil
}
