//! gpuprof-collector, the process: its flags, the runtime, the two servers and the signals that
//! stop them. What it receives, keeps and serves is the library's (`lib.rs`).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;

use gpuprof_collector::collector::Collector;
use gpuprof_collector::config::{Args, Config};
use gpuprof_collector::forward::Forwarder;
use gpuprof_collector::reports::Reports;
use gpuprof_collector::state::State;
use gpuprof_collector::store::Store;
use gpuprof_collector::{api, receive};

/// How long a shutdown waits for requests in flight.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

fn main() -> ExitCode {
    limit_malloc_arenas();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("GPUPROF_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match args.config().and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gpuprof-collector: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// glibc gives each thread that allocates its own heap ("arena"), up to 8 per core, and keeps what
/// is freed in each: a collector whose runtime threads decode requests of every size grows
/// without holding more (measured: 290 MB after a minute of 100 nodes, 160 MB with two arenas).
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's settings; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn run(config: Config) -> Result<()> {
    let (store, loaded) = Store::open(&config.db)?;
    for warning in &loaded.warnings {
        eprintln!("gpuprof-collector: {warning}");
    }
    let state = State::new(loaded.nodes, loaded.findings);
    let reports = Reports::new(loaded.reports);
    let forwarder = config
        .forward_endpoint
        .as_deref()
        .map(Forwarder::start)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--forward-endpoint {e}"))?;
    let collector = Arc::new(Collector::new(config.clone(), state, reports, store, forwarder));
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the runtime")?;
    runtime.block_on(serve(collector.clone()))?;
    collector.checkpoint().context("cannot save the state at shutdown")?;
    eprintln!("gpuprof-collector: state saved to {}", config.db.display());
    Ok(())
}

async fn serve(collector: Arc<Collector>) -> Result<()> {
    let config = &collector.config;
    let http_listener = tokio::net::TcpListener::bind(config.http_listen)
        .await
        .with_context(|| format!("--http-listen {}: cannot listen there", config.http_listen))?;
    let grpc_listener = tokio::net::TcpListener::bind(config.grpc_listen)
        .await
        .with_context(|| format!("--grpc-listen {}: cannot listen there", config.grpc_listen))?;
    eprintln!(
        "gpuprof-collector: OTLP/gRPC on {}, OTLP/HTTP + API + /metrics on {}, state in {}",
        grpc_listener.local_addr()?,
        http_listener.local_addr()?,
        config.db.display()
    );
    let (stop, _) = tokio::sync::broadcast::channel::<()>(1);
    let app = receive::http::routes(collector.clone()).merge(api::routes(collector.clone()));
    let mut http_stop = stop.subscribe();
    let http = axum::serve(http_listener, app.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async move {
            let _ = http_stop.recv().await;
        });
    let (logs, traces, metrics) = receive::grpc::services(collector.clone());
    let mut grpc_stop = stop.subscribe();
    let grpc = tonic::transport::Server::builder()
        .add_service(logs)
        .add_service(traces)
        .add_service(metrics)
        .serve_with_incoming_shutdown(tonic::transport::server::TcpIncoming::from(grpc_listener), async move {
            let _ = grpc_stop.recv().await;
        });
    let checkpoints = {
        let collector = collector.clone();
        let every = config.checkpoint_every;
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let collector = collector.clone();
                let saved = tokio::task::spawn_blocking(move || collector.checkpoint()).await;
                if let Ok(Err(error)) = saved {
                    tracing::error!("checkpoint: {error:#}");
                }
            }
        })
    };
    let signals = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        anyhow::Ok(())
    };
    let servers = async {
        tokio::try_join!(async { http.await.context("HTTP server") }, async { grpc.await.context("gRPC server") })
    };
    tokio::pin!(servers);
    tokio::select! {
        result = &mut servers => { result?; }
        result = signals => {
            result.context("cannot wait for signals")?;
            let _ = stop.send(());
            // Connected agents keep their connections open: give requests in flight a moment,
            // then save the state regardless.
            if let Ok(result) = tokio::time::timeout(SHUTDOWN_GRACE, &mut servers).await {
                result?;
            }
        }
    }
    checkpoints.abort();
    Ok(())
}
