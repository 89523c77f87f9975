//! The contract between this module and `store/redis/lua/pacing.lua`: the
//! same observation and Reconsider sequence, run through both, must leave
//! the same state and give the same answers at every step. Run against a
//! private `redis-server` (skipped with a notice when none is installed).

use serde_json::{Value, json};

use super::*;
use crate::testing::RedisServer;

const T0: i64 = 1_700_000_000_000;

/// Runs `steps` through the Lua port and returns one line per step.
const DRIVER: &str = r"
local P = cjson.decode(ARGV[1])
local steps = cjson.decode(ARGV[2])
local p = pace_new(tonumber(ARGV[3]), P)
local out = {}
for _, s in ipairs(steps) do
  local line
  if s.k == 'o' then
    pace_observe(p, P, s.now, s.first, s.ok, s.rej, s.hints, s.cd, s.cda)
    line = 'o'
  else
    local kind, a, b = pace_decide(p, P, s.now, s.floor, s.deadline, s.reserve,
      s.jitter, s.waiting, s.cursor, s.first == 1)
    line = kind .. ' ' .. string.format('%d', a) .. ' ' .. string.format('%d', b or 0)
  end
  for _, f in ipairs(PACE_FIELDS) do line = line .. ' ' .. string.format('%d', p[f]) end
  out[#out + 1] = line
end
return out
";

/// A seeded mix of reports (overload, outage, re-arming hints, cooldowns)
/// and Reconsiders, 90 s long.
fn steps(seed: u64) -> Vec<Value> {
    mix(seed, 300, 0)
}

/// Like [`steps`], but reports every few tens of milliseconds with about as
/// many successes as first attempts plus a little: a route near its edge,
/// where windows alternate between clean probes and a few rejections.
fn edge_steps(seed: u64) -> Vec<Value> {
    mix(seed, 60, 1)
}

/// Like [`steps`], but a fleet's storm: clean windows, then every thirty
/// seconds an outage of five seconds and a part, each closed by one hint
/// that ends at a different point of a window (at its start, in its first
/// half, in its second half), then clean windows again while the backlog
/// asks for slots.
fn outage_steps(seed: u64) -> Vec<Value> {
    mix(seed, 60, 2)
}

/// A seeded source of jitter: `next(n)` is in `0..n`.
fn seeded(seed: u64) -> impl FnMut(i64) -> i64 {
    let mut x = seed;
    move |n: i64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((x >> 33) % n.max(1) as u64) as i64
    }
}

/// A route whose first attempts (100/s, all served) suddenly get half
/// served: it saturates inside that window, at half what it is estimated to
/// serve. Then for ten seconds a backlog asks for slots every 5 ms, faster
/// than the rate gives them (now and then with a second booked ahead: ask
/// again, demand the rate fell short of), and the upstream serves what it
/// is sent: clean windows whose demand goes short, where the rate climbs
/// back to the edge it estimated and past it. Seeded jitter in the counts.
/// With `refused_ms` over a second, the rejections go on after the first
/// and each report says `served_while_refused` was served: nothing, an
/// outage answering with short hints, where the rate halves past anything
/// served and the climb back is slow start.
fn saturated_steps(seed: u64, refused_ms: i64, served_while_refused: i64) -> Vec<Value> {
    let mut next = seeded(seed);
    let mut out = Vec::new();
    let report = |now: i64, first: i64, ok: i64, rej: i64| {
        json!({"k": "o", "now": now, "first": first, "ok": ok, "rej": rej,
               "hints": [], "cd": 0, "cda": 0})
    };
    for t in (0..10_000).step_by(100) {
        let first = 9 + next(3);
        out.push(report(T0 + t, first, first, 0));
    }
    let back = 10_000 + refused_ms;
    for t in (10_000..back).step_by(100) {
        // The first second saturates the route; what follows it serves
        // `served_while_refused`.
        let served = if t < 11_000 {
            4 + next(2)
        } else {
            served_while_refused
        };
        out.push(report(T0 + t, 10, served, 5));
    }
    for t in (back..back + 10_000).step_by(5) {
        let now = T0 + t;
        out.push(if t % 100 == 0 {
            report(now, 0, 5 + next(3), 0)
        } else {
            let ahead = if next(4) == 0 { 1_000_000 } else { 0 };
            json!({
                "k": "d", "now": now, "floor": now, "deadline": now + 10_000,
                "reserve": 100, "jitter": next(1_000_000), "waiting": next(50),
                "cursor": now * 1000 + ahead, "first": next(2),
            })
        });
    }
    out
}

fn mix(seed: u64, gap: i64, edge: i64) -> Vec<Value> {
    let mut next = seeded(seed);
    let mut now = T0;
    let mut cursor = 0;
    let mut out = Vec::new();
    while now < T0 + 90_000 {
        now += next(gap);
        let report = next(3) == 0;
        if report && edge == 1 {
            // Every third window draws a few rejections, now and then one
            // with a short hint, and every other of those all inside a
            // short cooldown; the others are clean.
            let window = (now - T0) / 1000;
            let rejecting = window % 3 == 0;
            let paused = window % 6 == 3;
            let hints: Vec<i64> = if rejecting && next(10) == 0 {
                vec![now + 1000]
            } else {
                Vec::new()
            };
            let first = 40 + next(5);
            out.push(json!({
                "k": "o", "now": now, "first": first, "ok": first + next(12),
                "rej": if rejecting { next(4) } else { 0 },
                "cd": if paused || next(8) == 0 { now + 500 } else { 0 },
                "cda": if hints.is_empty() { 0 } else { now + 1000 },
                "hints": hints,
            }));
        } else if report && edge == 2 {
            let cycle = (now - T0) % 30_000;
            let ends = now - cycle + 15_000 + (now - T0) / 30_000 * 389 % 1000;
            let outage = cycle >= 10_000 && now < ends;
            let first = 30 + next(20);
            out.push(if outage {
                json!({
                    "k": "o", "now": now, "first": first, "ok": 0, "rej": first,
                    "hints": [ends], "cd": ends, "cda": ends,
                })
            } else {
                json!({
                    "k": "o", "now": now, "first": first, "ok": first + next(30),
                    "rej": 0, "hints": [], "cd": 0, "cda": 0,
                })
            });
        } else if report {
            let hints: Vec<i64> = (0..next(4) * next(2))
                .map(|_| match next(6) {
                    0 => T0 + 40_000,
                    1 => now + 30_000 + next(5) * 1000,
                    _ => now + 1000,
                })
                .collect();
            out.push(json!({
                "k": "o", "now": now, "first": next(120), "ok": next(150),
                "rej": next(40) * next(2), "hints": hints,
                "cd": if next(4) == 0 { now + 500 } else { 0 },
                "cda": match next(8) { 0 => now + 30_000, 1 => now + 1_000, _ => 0 },
            }));
        } else {
            out.push(json!({
                "k": "d", "now": now, "floor": now + next(3) * next(5000),
                "deadline": now + 200 + next(30_000), "reserve": 100,
                "jitter": next(1_000_000), "waiting": next(5000), "cursor": cursor,
                "first": next(2),
            }));
            cursor = cursor.max(now * 1000 + next(2_000_000));
        }
    }
    out
}

/// The same steps through the Rust controller, in the driver's format.
fn run_rust(p: &PacingPolicy, steps: &[Value]) -> Vec<String> {
    let n = |s: &Value, k: &str| s[k].as_i64().expect(k);
    let mut st = PacingState::new(T0, p);
    steps
        .iter()
        .map(|s| {
            let mut line = if s["k"] == "o" {
                let hints: Vec<i64> = s["hints"]
                    .as_array()
                    .expect("hints")
                    .iter()
                    .map(|h| h.as_i64().expect("hint"))
                    .collect();
                st.observe(
                    &Observation {
                        now_ms: n(s, "now"),
                        first_attempts: n(s, "first") as u32,
                        successes: n(s, "ok") as u32,
                        rejections: n(s, "rej") as u32,
                        hint_until_ms: &hints,
                        cooldown_until_ms: n(s, "cd"),
                        cooldown_after_ms: n(s, "cda"),
                    },
                    p,
                );
                "o".to_owned()
            } else {
                let ask = WakeAsk {
                    now_ms: n(s, "now"),
                    floor_ms: n(s, "floor"),
                    deadline_ms: n(s, "deadline"),
                    reserve_ms: n(s, "reserve"),
                    jitter_ppm: n(s, "jitter") as u32,
                    waiting: n(s, "waiting"),
                    cursor_us: n(s, "cursor"),
                    first_attempt: n(s, "first") == 1,
                };
                match st.decide(&ask, p) {
                    SlotDecision::Slot { at_ms, cursor_us } => format!("slot {at_ms} {cursor_us}"),
                    SlotDecision::AskAgain { at_ms } => format!("again {at_ms} 0"),
                    SlotDecision::Infeasible { at_ms } => format!("infeasible {at_ms} 0"),
                }
            };
            for (_, v) in st.to_fields() {
                line.push_str(&format!(" {v}"));
            }
            line
        })
        .collect()
}

fn lua_policy(p: &PacingPolicy) -> String {
    json!({
        "pinned_m": p.pinned_m.unwrap_or(-1),
        "known_m": p.known_limit_m.unwrap_or(-1),
        "floor_m": p.floor_m,
        "ceiling_m": p.ceiling_m,
        "horizon_ms": p.horizon_ms,
    })
    .to_string()
}

#[test]
fn the_lua_port_agrees_with_the_rust_controller_step_by_step() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let client = redis::Client::open(server.url()).expect("client");
    let mut conn = client.get_connection().expect("connect");
    let source = format!(
        "{}\n{}\n{}",
        crate::store::redis::scripts::prelude(),
        include_str!("../store/redis/lua/pacing.lua"),
        DRIVER
    );
    let script = redis::Script::new(&source);
    let policies = [
        PacingPolicy::default(),
        PacingPolicy {
            pinned_m: Some(37_500),
            ..PacingPolicy::default()
        },
        PacingPolicy {
            known_limit_m: Some(5_000),
            ..PacingPolicy::default()
        },
        PacingPolicy {
            floor_m: 3_000,
            ceiling_m: 90_000,
            horizon_ms: 2_500,
            ..PacingPolicy::default()
        },
    ];
    let mut seen = std::collections::BTreeSet::new();
    // Each line ends with every field in order; the mode is this far from
    // its end.
    let fields = PacingState::new(0, &PacingPolicy::default()).to_fields();
    let mode_from_end = fields.len()
        - fields
            .iter()
            .position(|&(name, _)| name == "mode")
            .expect("a mode field");
    for (i, p) in policies.iter().enumerate() {
        for seed in 1..=14 {
            let steps = match seed {
                1..=4 => steps(seed * 31 + i as u64),
                5..=8 => edge_steps(seed * 31 + i as u64),
                9..=10 => outage_steps(seed * 31 + i as u64),
                11..=12 => saturated_steps(seed * 31 + i as u64, 1000, 0),
                _ => saturated_steps(seed * 31 + i as u64, 3000, 0),
            };
            let want = run_rust(p, &steps);
            for line in &want {
                let words: Vec<&str> = line.split(' ').collect();
                seen.insert(format!(
                    "{} mode {}",
                    words[0],
                    words[words.len() - mode_from_end]
                ));
            }
            let got: Vec<String> = script
                .arg(lua_policy(p))
                .arg(Value::Array(steps).to_string())
                .arg(T0)
                .invoke(&mut conn)
                .expect("the driver runs");
            assert_eq!(got.len(), want.len());
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "policy {i}, seed {seed}, step {k}");
            }
        }
    }
    // The sequences reach every answer and every mode, or the agreement
    // proves less than it says.
    let seen: String = seen.into_iter().collect::<Vec<_>>().join(", ");
    for needle in [
        "slot",
        "again",
        "infeasible",
        "mode 1",
        "mode 2",
        "mode 3",
        "mode 4",
        "mode 5",
        "mode 6",
    ] {
        assert!(seen.contains(needle), "{needle} never reached: {seen}");
    }
}
