// Command cronvectors evaluates a corpus of cron expressions with
// github.com/robfig/cron/v3's ParseStandard (the parser River's documentation
// uses for periodic jobs) and writes, for each expression and start instant,
// the chain of next fire times as JSON. It also records which expressions the
// parser rejects and which parse but never fire. river_anyio's cron parser is
// tested against the output.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/robfig/cron/v3"
)

// A case: an expression, a start instant (RFC 3339) and the zone the start
// instant is expressed in (it decides the zone of expressions without a
// CRON_TZ/TZ prefix, as in robfig/cron).
type caseSpec struct {
	Expr  string
	Start string
	Zone  string
	N     int
}

type caseOut struct {
	Expr  string    `json:"expr"`
	Start string    `json:"start"`
	Zone  string    `json:"zone"`
	Next  []*string `json:"next"` // RFC 3339 with the offset of the returned time; null = zero time (never)
	Unix  []*int64  `json:"unix"`
}

type invalidOut struct {
	Expr  string `json:"expr"`
	Error string `json:"error"`
}

type output struct {
	Generator string       `json:"generator"`
	Cases     []caseOut    `json:"cases"`
	Invalid   []invalidOut `json:"invalid"`
	Never     []caseOut    `json:"never"`
}

func c(expr, start, zone string, n int) caseSpec { return caseSpec{expr, start, zone, n} }

const (
	utc = "UTC"
	ny  = "America/New_York"
	lon = "Europe/London"
	lh  = "Australia/Lord_Howe"
)

var cases = []caseSpec{
	// plain fields, lists, ranges, steps
	c("* * * * *", "2024-01-01T00:00:00Z", utc, 4),
	c("* * * * *", "2024-01-01T00:00:59.500Z", utc, 3),
	c("*/15 * * * *", "2024-01-01T00:07:00Z", utc, 6),
	c("0 * * * *", "2024-01-01T23:30:00Z", utc, 4),
	c("30 2 * * *", "2024-02-27T12:00:00Z", utc, 5),
	c("0 0 1 * *", "2024-01-15T00:00:00Z", utc, 6),
	c("0 0 1 1 *", "2023-06-01T00:00:00Z", utc, 3),
	c("5 4 * * sun", "2024-05-01T00:00:00Z", utc, 4),
	c("0 22 * * 1-5", "2024-05-03T21:00:00Z", utc, 6),
	c("23 0-20/2 * * *", "2024-05-01T19:00:00Z", utc, 6),
	c("0 0,12 1 */2 *", "2024-01-01T06:00:00Z", utc, 6),
	c("0 4 8-14 * *", "2024-02-20T00:00:00Z", utc, 8),
	c("0 0 * * MON-FRI", "2024-06-07T12:00:00Z", utc, 6),
	c("0 9 * JAN,JUL *", "2024-01-30T10:00:00Z", utc, 4),
	c("0 9 * jan-mar mon", "2024-03-20T00:00:00Z", utc, 5),
	c("15 10 ? * *", "2024-01-01T10:15:00Z", utc, 3),
	c("0 0 31 * *", "2024-01-31T00:00:00Z", utc, 7),
	c("0 0 29 2 *", "2023-01-01T00:00:00Z", utc, 3),
	c("0 0 29 2 *", "2096-03-01T00:00:00Z", utc, 2),
	c("59 23 31 12 *", "2024-12-31T23:59:00Z", utc, 2),
	c("5/15 * * * *", "2024-01-01T00:00:00Z", utc, 6),
	c("10-40/10 * * * *", "2024-01-01T00:45:00Z", utc, 5),
	c("*/7 * * * *", "2024-01-01T00:50:00Z", utc, 5),
	c("0 */5 * * *", "2024-01-01T21:00:00Z", utc, 4),
	c("0 0 */10 * *", "2024-01-25T00:00:00Z", utc, 5),
	c("0 0 1 */5 *", "2024-02-01T00:00:00Z", utc, 4),
	c("0 0 * * 1/2", "2024-01-01T00:00:00Z", utc, 6),
	c("0 0 * * 0,sat", "2024-01-01T00:00:00Z", utc, 5),
	c("0 0 1 dec *", "2024-01-01T00:00:00Z", utc, 2),
	c("0 0 * Feb-Apr Tue", "2024-04-25T00:00:00Z", utc, 4),
	c("*/1 * * * *", "2024-01-01T00:00:00Z", utc, 2),
	c("*-5 * * * *", "2024-01-01T00:00:00Z", utc, 3),
	c("00 09 * * *", "2024-01-01T00:00:00Z", utc, 2),
	c("+5 * * * *", "2024-01-01T00:00:00Z", utc, 2),
	c("0,,30 * * * *", "2024-01-01T00:00:00Z", utc, 3),
	c("0 0 * * 1,", "2024-01-01T00:00:00Z", utc, 2),
	c("  0   0  *  *  * ", "2024-01-01T00:00:00Z", utc, 2),
	c("0\t0\t*\t*\t*", "2024-01-01T00:00:00Z", utc, 2),
	c("0 12 * * *", "1969-12-31T00:00:00Z", utc, 3),
	// day-of-month / day-of-week combinations
	c("0 0 13 * 5", "2024-01-01T00:00:00Z", utc, 8),
	c("0 0 1-7 * 1", "2024-01-01T00:00:00Z", utc, 10),
	c("0 0 */2 * 1", "2024-01-01T00:00:00Z", utc, 8),
	c("0 0 * * */2", "2024-01-01T00:00:00Z", utc, 6),
	c("0 0 ? * MON", "2024-01-01T00:00:00Z", utc, 3),
	c("0 0 1 * ?", "2024-01-01T00:00:00Z", utc, 3),
	c("0 0 */1 * 1", "2024-01-01T00:00:00Z", utc, 4),
	c("0 0 1,15 * 3", "2024-01-01T00:00:00Z", utc, 8),
	c("0 0 31 2 1", "2024-01-01T00:00:00Z", utc, 5),
	c("0 0 1 * */1", "2024-01-01T00:00:00Z", utc, 3),
	// descriptors
	c("@yearly", "2024-06-01T00:00:00Z", utc, 3),
	c("@annually", "2024-01-01T00:00:00Z", utc, 2),
	c("@monthly", "2024-01-31T00:00:00Z", utc, 4),
	c("@weekly", "2024-01-01T00:00:00Z", utc, 3),
	c("@daily", "2024-01-01T00:00:00Z", utc, 3),
	c("@midnight", "2024-02-28T13:00:00Z", utc, 3),
	c("@hourly", "2024-01-01T00:30:00Z", utc, 3),
	c("@every 90s", "2024-01-01T00:00:00.250Z", utc, 3),
	c("@every 1h30m", "2024-01-01T00:00:00Z", utc, 3),
	c("@every 1.5s", "2024-01-01T00:00:00Z", utc, 3),
	c("@every 500ms", "2024-01-01T00:00:00Z", utc, 3),
	c("@every 0", "2024-01-01T00:00:00Z", utc, 2),
	c("@every -5m", "2024-01-01T00:00:00Z", utc, 2),
	c("@every 1h0.5s", "2024-01-01T00:00:00Z", utc, 2),
	c("@every .5h", "2024-01-01T00:00:00Z", utc, 2),
	c("@every 1.999999999999s", "2024-01-01T00:00:00Z", utc, 2),
	c("@every 2h45m10s1ms", "2024-01-01T00:00:00Z", utc, 2),
	c("@every 3µs", "2024-01-01T00:00:00Z", utc, 2),
	c("@every 1000000us", "2024-01-01T00:00:00Z", utc, 2),
	c("@every 100000h", "2024-01-01T00:00:00Z", utc, 2),
	c("@every 90s", "2024-03-10T06:59:00Z", ny, 3),
	c("@daily", "2024-03-09T12:00:00Z", ny, 4),
	c("@weekly", "2024-10-20T12:00:00Z", lon, 3),
	c("@monthly", "2024-09-15T12:00:00Z", lh, 3),
	// time zone prefixes
	c("CRON_TZ=America/New_York 0 9 * * *", "2024-01-01T00:00:00Z", utc, 3),
	c("TZ=Asia/Tokyo 30 8 * * *", "2024-01-01T00:00:00Z", utc, 3),
	c("CRON_TZ=Europe/London @daily", "2024-03-29T12:00:00Z", utc, 4),
	c("CRON_TZ=UTC 0 0 * * *", "2024-01-01T00:00:00Z", ny, 2),
	c("TZ= 0 0 * * *", "2024-01-01T00:00:00Z", ny, 2),
	c("CRON_TZ=Asia/Kolkata 0 0 * * *", "2024-01-01T00:00:00Z", utc, 2),
	c("CRON_TZ=Asia/Kathmandu 0 * * * *", "2024-01-01T00:00:00Z", utc, 3),
	c("CRON_TZ=America/St_Johns 0 2 * * *", "2024-03-09T12:00:00Z", utc, 4),
	c("CRON_TZ=Pacific/Chatham 45 2 * * *", "2024-09-27T00:00:00Z", utc, 4),
	c("CRON_TZ=America/New_York   @every 1h", "2024-01-01T00:00:00Z", utc, 2),
	c("TZ=Europe/Berlin 0 2 * * *", "2024-03-30T12:00:00Z", lon, 3),
	// DST: America/New_York, spring forward 2024-03-10 02:00 -> 03:00
	c("30 2 * * *", "2024-03-08T12:00:00Z", ny, 5),
	c("0 2 * * *", "2024-03-08T12:00:00Z", ny, 5),
	c("* 2 * * *", "2024-03-10T06:58:00Z", ny, 5),
	c("0 * * * *", "2024-03-10T05:30:00Z", ny, 5),
	c("0 1,2,3 * * *", "2024-03-09T12:00:00Z", ny, 6),
	c("@hourly", "2024-03-10T05:30:00Z", ny, 4),
	c("*/30 * * * *", "2024-03-10T06:15:00Z", ny, 5),
	c("*/15 2 * * *", "2024-03-09T12:00:00Z", ny, 6),
	c("0 0 * * *", "2024-03-09T12:00:00Z", ny, 3),
	c("CRON_TZ=America/New_York 30 2 * * *", "2024-03-09T12:00:00Z", utc, 3),
	c("CRON_TZ=America/New_York 0 2 10 3 *", "2024-03-01T00:00:00Z", utc, 2),
	// America/New_York, fall back 2024-11-03 02:00 EDT -> 01:00 EST
	c("30 1 * * *", "2024-11-02T12:00:00Z", ny, 4),
	c("0 1 * * *", "2024-11-02T12:00:00Z", ny, 4),
	c("0 * * * *", "2024-11-03T04:30:00Z", ny, 5),
	c("*/20 1 * * *", "2024-11-03T04:30:00Z", ny, 7),
	c("30 1 * * *", "2024-11-03T05:45:00Z", ny, 3),
	c("0 2 * * *", "2024-11-02T12:00:00Z", ny, 3),
	c("CRON_TZ=America/New_York 30 1 * * *", "2024-11-03T05:30:00Z", utc, 3),
	c("@every 1h", "2024-11-03T04:30:00Z", ny, 4),
	// Europe/London, 2024-03-31 01:00 GMT -> 02:00 BST; 2024-10-27 02:00 BST -> 01:00 GMT
	c("30 1 * * *", "2024-03-30T12:00:00Z", lon, 4),
	c("0 1 * * *", "2024-03-30T12:00:00Z", lon, 4),
	c("@hourly", "2024-03-30T23:30:00Z", lon, 4),
	c("*/15 1 * * *", "2024-03-30T12:00:00Z", lon, 6),
	c("30 1 * * *", "2024-10-26T12:00:00Z", lon, 4),
	c("0 1 * * *", "2024-10-26T12:00:00Z", lon, 4),
	c("@hourly", "2024-10-26T23:30:00Z", lon, 5),
	c("*/15 1 * * *", "2024-10-26T12:00:00Z", lon, 9),
	c("CRON_TZ=Europe/London 30 1 * * *", "2024-10-27T00:40:00Z", utc, 3),
	c("CRON_TZ=Europe/London 0 * * * *", "2024-03-30T23:30:00Z", ny, 4),
	// Australia/Lord_Howe: +10:30 / +11:00 (a 30-minute shift);
	// 2024-04-07 02:00 -> 01:30, 2024-10-06 02:00 -> 02:30
	c("15 2 * * *", "2024-10-04T12:00:00Z", lh, 4),
	c("45 1 * * *", "2024-04-05T12:00:00Z", lh, 4),
	c("*/15 * * * *", "2024-10-05T15:00:00Z", lh, 6),
	c("*/15 * * * *", "2024-04-06T14:00:00Z", lh, 8),
	c("0 * * * *", "2024-04-06T13:00:00Z", lh, 5),
	c("0 * * * *", "2024-10-05T13:00:00Z", lh, 5),
	c("@daily", "2024-10-04T12:00:00Z", lh, 3),
	c("CRON_TZ=Australia/Lord_Howe 40 1 * * *", "2024-04-05T12:00:00Z", utc, 4),
	c("CRON_TZ=Australia/Lord_Howe 10 2 * * *", "2024-10-04T12:00:00Z", utc, 4),
	// midnight transitions: Sao Paulo 2018-11-04 00:00 -> 01:00 (and back 2019-02-17),
	// Santiago 2024-09-08 00:00 -> 01:00, Havana 2024-03-10 00:00 -> 01:00
	c("CRON_TZ=America/Sao_Paulo 0 0 * * *", "2018-11-02T12:00:00Z", utc, 4),
	c("CRON_TZ=America/Sao_Paulo 30 0 * * *", "2018-11-02T12:00:00Z", utc, 4),
	c("CRON_TZ=America/Sao_Paulo 0 0 4 11 *", "2018-10-01T00:00:00Z", utc, 2),
	c("CRON_TZ=America/Sao_Paulo 0 23 * * *", "2019-02-15T12:00:00Z", utc, 4),
	c("CRON_TZ=America/Sao_Paulo 0 0 * * 0", "2018-10-30T12:00:00Z", utc, 3),
	c("CRON_TZ=America/Santiago 0 0 * * *", "2024-09-06T12:00:00Z", utc, 4),
	c("CRON_TZ=America/Santiago 0 0 * * *", "2024-04-05T12:00:00Z", utc, 4),
	c("CRON_TZ=America/Havana 0 0 * * *", "2024-03-08T12:00:00Z", utc, 4),
	c("CRON_TZ=America/Havana 0 0 10 3 *", "2024-03-01T00:00:00Z", utc, 2),
	c("@midnight", "2018-11-02T12:00:00Z", "America/Sao_Paulo", 4),
}

var invalid = []string{
	"",
	" ",
	"* * * *",
	"* * * * * *",
	"60 * * * *",
	"* 24 * * *",
	"* * 0 * *",
	"* * 32 * *",
	"* * * 13 *",
	"* * * 0 *",
	"* * * * 7",
	"* * * * 8",
	"5-3 * * * *",
	"*/0 * * * *",
	"1-2-3 * * * *",
	"1/2/3 * * * *",
	"a * * * *",
	"* * * * mon-",
	"* * * foo *",
	"* * * * MONDAY",
	"* * * JANUARY *",
	"* * mon * *",
	"jan * * * *",
	"* * * * */-1",
	"-1 * * * *",
	"*/ * * * *",
	"/5 * * * *",
	"1- * * * *",
	"*/5/ * * * *",
	"99999999999999999999 * * * *",
	"1.5 * * * *",
	"0x10 * * * *",
	"@every",
	"@every ",
	"@every 5",
	"@every 5x",
	"@every .s",
	"@every 1h-5m",
	"@every 1h ",
	"@every  1h",
	"@every 9999999999h",
	"@yearly ",
	"@foo",
	"@DAILY",
	"@ daily",
	"CRON_TZ=Nowhere/Place 0 0 * * *",
	"TZ=Mars/Base @daily",
	"CRON_TZ=america/new_york 0 0 * * *",
	"CRON_TZ=../etc/passwd 0 0 * * *",
	"TZ=UTC",
	"CRON_TZ=UTC",
	"TZ=UTC * * * *",
	"cron_tz=UTC 0 0 * * *",
	" TZ=UTC 0 0 * * *",
}

// Expressions the parser accepts whose schedule can never fire.
var never = []string{
	"0 0 30 2 *",
	"0 0 31 4,6,9,11 *",
	"0 0 31 2 *",
	", * * * *",
	"0 0 , * *",
}

func strp(s string) *string { return &s }
func i64p(i int64) *int64   { return &i }

func main() {
	outPath := flag.String("out", "../../data/cron_vectors.json", "output file")
	flag.Parse()
	out := output{Generator: "river_anyio_tests/periodic/cron_vectors (github.com/robfig/cron/v3 v3.0.1 ParseStandard)"}
	for _, cs := range cases {
		sched, err := cron.ParseStandard(cs.Expr)
		if err != nil {
			fail("%q: %v", cs.Expr, err)
		}
		out.Cases = append(out.Cases, chain(sched, cs))
	}
	for _, expr := range invalid {
		msg := parseErr(expr)
		if msg == "" {
			fail("%q was accepted", expr)
		}
		out.Invalid = append(out.Invalid, invalidOut{Expr: expr, Error: msg})
	}
	for _, expr := range never {
		sched, err := cron.ParseStandard(expr)
		if err != nil {
			fail("%q: %v", expr, err)
		}
		res := chain(sched, caseSpec{expr, "2024-01-01T00:00:00Z", utc, 1})
		if res.Next[0] != nil {
			fail("%q fires at %s", expr, *res.Next[0])
		}
		out.Never = append(out.Never, res)
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		fail("%v", err)
	}
	if err := os.WriteFile(*outPath, append(data, '\n'), 0o644); err != nil {
		fail("%v", err)
	}
	fmt.Printf("%d cases, %d invalid, %d never -> %s\n", len(out.Cases), len(out.Invalid), len(out.Never), *outPath)
}

func chain(sched cron.Schedule, cs caseSpec) caseOut {
	loc, err := time.LoadLocation(cs.Zone)
	if err != nil {
		fail("%v", err)
	}
	start, err := time.Parse(time.RFC3339Nano, cs.Start)
	if err != nil {
		fail("%v", err)
	}
	t := start.In(loc)
	res := caseOut{Expr: cs.Expr, Start: cs.Start, Zone: cs.Zone, Next: []*string{}, Unix: []*int64{}}
	for range cs.N {
		t = sched.Next(t)
		if t.IsZero() {
			res.Next = append(res.Next, nil)
			res.Unix = append(res.Unix, nil)
			break
		}
		res.Next = append(res.Next, strp(t.Format(time.RFC3339Nano)))
		res.Unix = append(res.Unix, i64p(t.Unix()))
	}
	return res
}

// parseErr returns the parse error (or the panic) for expr, or "" if it parses.
func parseErr(expr string) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprintf("panic: %v", r)
		}
	}()
	if _, err := cron.ParseStandard(expr); err != nil {
		return err.Error()
	}
	return ""
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "error: "+format+"\n", args...)
	os.Exit(1)
}
