'use strict';
// Drives npm ali-ons against our broker for the interop tests.
// argv[2]: JSON {nameSrv, producerGroup?, topic?, send?: [topic], consumers: [{group, topic, expr, broadcast}],
// accessKey?, secretKey?, reportNotify?: bool}
// stdout protocol: "SENT <topic> <outcome>" for each topic of `send` (the producer sends one message to each before
// the consumers start), "READY <clientId>" once every role is ready, "CLOSED" after a "close" line on stdin; with
// reportNotify, "NOTIFY <consumerGroup>" for each NOTIFY_CONSUMER_IDS_CHANGED (40) the broker sends the client (ali-ons
// reads it off its channel and otherwise ignores it), from the start of its first consumer.
const path = require('path');
const readline = require('readline');
const { Producer, Consumer, Message } = require(path.join(process.env.ONS_NODE_DIR, 'node_modules', 'ali-ons'));

const spec = JSON.parse(process.argv[2]);
const lines = [];
const logger = {};
for (const level of [ 'debug', 'info', 'warn', 'error' ]) {
  logger[level] = (...args) => {
    if (level === 'warn' || level === 'error') {
      lines.push(`[${level}] ${args.map(String).join(' ')}`);
      process.stderr.write(`[ali-ons ${level}] ${args.map(String).join(' ')}\n`);
    }
  };
}
// ali-ons asserts an httpclient for the address-server lookup; never let it reach the network
const httpclient = { request: () => Promise.reject(new Error('no address server in tests')) };
const common = { nameSrv: spec.nameSrv, httpclient, logger };
if (spec.accessKey) {
  common.accessKeyId = spec.accessKey;
  common.accessKeySecret = spec.secretKey;
}

async function main() {
  const roles = [];
  let clientId = null;
  let notifyReported = false;
  if (spec.producerGroup) {
    const producer = new Producer(Object.assign({ producerGroup: spec.producerGroup }, common));
    await producer.ready();
    roles.push(producer);
    clientId = producer._mqClient ? producer._mqClient.clientId : clientId;
    for (const topic of spec.send || []) {
      let outcome;
      try {
        outcome = (await producer.send(new Message(topic, 'TagA', Buffer.from('interop')))).sendStatus;
      } catch (err) {
        outcome = `error ${err && err.code !== undefined ? err.code : ''} ${err && err.message}`;
      }
      process.stdout.write(`SENT ${topic} ${String(outcome).replace(/\s+/g, ' ')}\n`);
    }
  }
  for (const c of spec.consumers || []) {
    const consumer = new Consumer(Object.assign({ consumerGroup: c.group, isBroadcast: !!c.broadcast }, common));
    if (spec.reportNotify && !notifyReported) {
      notifyReported = true;  // one MQClient per client id: every consumer of the process shares its channels
      consumer._mqClient.on('request', entity => {
        if (entity.data && entity.data.code === 40) {
          process.stdout.write(`NOTIFY ${(entity.data.extFields || {}).consumerGroup}\n`);
        }
      });
    }
    consumer.subscribe(c.topic, c.expr || '*', async () => {});
    await consumer.ready();
    roles.push(consumer);
    clientId = consumer._mqClient ? consumer._mqClient.clientId : clientId;
  }
  process.stdout.write(`READY ${clientId}\n`);
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    if (line.trim() === 'close') {
      break;
    }
  }
  for (const r of roles.reverse()) {
    await r.close();
  }
  process.stdout.write('CLOSED\n');
  process.exit(0);
}

main().catch(err => {
  process.stderr.write(`DRIVER ERROR ${err && err.stack || err}\n`);
  process.stdout.write(`FAILED ${err && err.message}\n`);
  process.exit(1);
});
