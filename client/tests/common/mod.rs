//! Test doubles the client's end-to-end tests share (the coordinator itself
//! is always the real one, from `tests/support`): a scripted upstream for
//! the gate, and a way to serve any `Budget` implementation over pipes.
//! Used by `client/tests/*.rs` as `mod common;`.

// Each test binary uses a different subset.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tollgate_client::engine::Observation;
use tollgate_client::gate::{Attempt, Reply};
use tollgate_proto::v1::budget_server::Budget;

/// An upstream that answers attempt `n` with `answers[n - 1]` (the last one
/// repeats) after `latency`, logging when each attempt started.
#[derive(Clone)]
pub(crate) struct Upstream {
    answers: Arc<Vec<Observation>>,
    /// How long each attempt takes; a test lengthens it for timeouts.
    pub(crate) latency: Duration,
    started: Arc<Mutex<Vec<(u32, Instant)>>>,
}

impl Upstream {
    pub(crate) fn new(answers: Vec<Observation>) -> Self {
        Upstream {
            answers: Arc::new(answers),
            latency: Duration::from_millis(20),
            started: Arc::default(),
        }
    }

    pub(crate) fn calls(&self) -> usize {
        self.started.lock().unwrap().len()
    }

    pub(crate) fn starts(&self) -> Vec<Instant> {
        self.started
            .lock()
            .unwrap()
            .iter()
            .map(|(_, at)| *at)
            .collect()
    }

    pub(crate) fn attempt(
        &self,
    ) -> impl FnMut(Attempt) -> std::pin::Pin<Box<dyn Future<Output = Reply<u32>> + Send>> + use<>
    {
        let this = self.clone();
        move |attempt: Attempt| {
            let this = this.clone();
            Box::pin(async move {
                this.started
                    .lock()
                    .unwrap()
                    .push((attempt.number, Instant::now()));
                tokio::time::sleep(this.latency).await;
                let index = usize::try_from(attempt.number - 1)
                    .unwrap()
                    .min(this.answers.len() - 1);
                Reply::new(this.answers[index].clone(), attempt.number)
            })
        }
    }
}

pub(crate) fn http(status: u16, retry_after: Option<&str>) -> Observation {
    Observation::http(status, retry_after)
}

/// Serves a `Budget` implementation (an upstream of the layer's tests, a
/// recording proxy in front of the coordinator) over in-memory pipes (paused
/// time again) and returns a channel to it.
pub(crate) fn serve_budget<B: Budget>(service: B) -> tonic::transport::Channel {
    let (conns, incoming) = tokio::sync::mpsc::channel::<tokio::io::DuplexStream>(8);
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(incoming),
        Ok::<_, std::io::Error>,
    );
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(tollgate_proto::v1::budget_server::BudgetServer::new(
                service,
            ))
            .serve_with_incoming(incoming),
    );
    tonic::transport::Endpoint::from_static("http://upstream.invalid").connect_with_connector_lazy(
        tower::service_fn(move |_| {
            let conns = conns.clone();
            async move {
                let (client, server) = tokio::io::duplex(64 * 1024);
                conns
                    .send(server)
                    .await
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::ConnectionRefused))?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(client))
            }
        }),
    )
}
