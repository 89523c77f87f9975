//! A route's budget ledger under a large fleet: the per-call work of a
//! Report (`deposit`) and a Lease (`grant`) when the class tracks a
//! thousand workers, each call naming one of them.
//!
//! `cargo bench --bench ledger`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate::budget::{BudgetLedger, GrantAsk};
use tollgate::policy::Policy;
use tollgate::scope::{Priority, RetryClass};
use tollgate::tenancy::Tenant;

const T0: i64 = 1_700_000_000_000;
const WORKERS: usize = 1000;

fn fleet() -> (BudgetLedger, Policy, Vec<String>) {
    let policy = Policy::default();
    let ids: Vec<String> = (0..WORKERS).map(|i| format!("worker-{i:04}")).collect();
    let mut ledger = BudgetLedger::new(T0);
    for id in &ids {
        ledger.deposit(&policy, id, Priority::Normal, 10, T0, Tenant::NONE);
    }
    (ledger, policy, ids)
}

fn ledger(c: &mut Criterion) {
    let (mut ledger, policy, ids) = fleet();
    let mut next = 0;
    c.bench_function("deposit, 1000 workers", |b| {
        b.iter(|| {
            next = (next + 7) % WORKERS;
            ledger.deposit(
                &policy,
                black_box(&ids[next]),
                Priority::Normal,
                1,
                T0 + 1,
                Tenant::NONE,
            );
        });
    });
    let (mut ledger, policy, ids) = fleet();
    let mut leases = 0u64;
    c.bench_function("grant 1, 1000 workers", |b| {
        b.iter(|| {
            next = (next + 7) % WORKERS;
            leases += 1;
            let ask = GrantAsk {
                worker_id: black_box(&ids[next]),
                priority: Priority::Normal,
                retry_class: RetryClass::Transient,
                want: 1,
                now_ms: T0 + 1,
                tenant: Tenant::NONE,
            };
            // A refusal (budget spent) costs the same lookup; either is fine.
            let _ = black_box(ledger.grant(&policy, ask, &format!("lease-{leases}")));
        });
    });
}

criterion_group!(benches, ledger);
criterion_main!(benches);
